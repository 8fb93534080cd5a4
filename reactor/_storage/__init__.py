"""The store: records, the write transaction, SQL, SQLite, PostgreSQL."""
