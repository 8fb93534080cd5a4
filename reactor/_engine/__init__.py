"""The engine: its write door, mailboxes, dispatcher, options, stats."""
