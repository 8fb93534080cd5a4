"""The systems ``reactor bench`` measures, each behind the adapter of ``peer``."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

from .peer import UPDATE_NAME, Peer, apply_update, reactor_target

__all__ = ["PEERS", "available", "redis_server_version"]


class _KeyValuePeer(Peer):
    """A peer whose plain verbs are those of one key-value object (``_kv``: its
    ``set``, ``get`` and ``delete``)."""

    _kv: Any

    def set(self, key: str, value: dict[str, Any]) -> None:
        self._kv.set(key, value)

    def get(self, key: str) -> Any:
        return self._kv.get(key)

    def delete(self, key: str) -> None:
        self._kv.delete(key)

    def count(self, key: str) -> int:
        return int(self._kv.get(key, 0))


class ReactorPeer(_KeyValuePeer):
    """reactor, on ``location``: a directory, or a PostgreSQL URL (``backends``)."""

    name = "reactor"
    aio = "reactor.aio"
    notes = (
        (
            "asyncio: reactor.aio on the same engine (writes queue for the actor and commit "
            "together; reads run in the loop's executor)"
        ),
    )

    def __init__(self, location: str) -> None:
        import reactor

        super().__init__(location)
        self._ops = reactor.ops
        self._state = reactor.open(reactor_target(location))
        self._kv = self._state.scope("bench")

    def increment(self, key: str) -> int:
        return int(self._kv.increment(key))

    def update(self, key: str) -> Any:
        ops = self._ops
        return self._kv.update(
            key, [ops.increment("n"), ops.set("name", UPDATE_NAME), ops.merge({"ok": False})]
        )

    async def astart(self) -> None:
        import reactor.aio

        self._aio = reactor.aio.open(reactor_target(self.location))
        await self._aio.__aenter__()
        self._ascope = self._aio.scope("bench")

    async def astop(self) -> None:
        await self._aio.close()

    async def acall(self, verb: str, *args: Any) -> Any:
        if verb == "update":
            ops = self._ops
            return await self._ascope.update(
                args[0],
                [ops.increment("n"), ops.set("name", UPDATE_NAME), ops.merge({"ok": False})],
            )
        return await getattr(self._ascope, verb)(*args)

    def transactions(self) -> int:
        return int(self._state.stats()["transactions"])

    def close(self) -> None:
        self._state.close()


class DictLockPeer(Peer):
    name = "dict+lock"
    in_memory = True
    notes = ("in memory: no process workloads; asyncio calls it inline (it never blocks)",)
    aio = "inline"

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self._data: dict[str, Any] = {}
        self._lock = threading.Lock()

    def set(self, key: str, value: dict[str, Any]) -> None:
        with self._lock:
            self._data[key] = value

    def get(self, key: str) -> Any:
        with self._lock:
            return self._data.get(key)

    def increment(self, key: str) -> int:
        with self._lock:
            value: int = self._data.get(key, 0) + 1
            self._data[key] = value
            return value

    def update(self, key: str) -> Any:
        with self._lock:
            value = apply_update(dict(self._data[key]))
            self._data[key] = value
            return value

    def delete(self, key: str) -> None:
        with self._lock:
            self._data.pop(key, None)

    def count(self, key: str) -> int:
        with self._lock:
            return int(self._data.get(key, 0))

    async def acall(self, verb: str, *args: Any) -> Any:
        return getattr(self, verb)(*args)

    def close(self) -> None:
        self._data.clear()


_UPSERT = "INSERT INTO kv (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
_DELETE = "DELETE FROM kv WHERE k = ?"


class SQLitePeer(Peer):
    """Raw sqlite3: WAL, ``synchronous=NORMAL``, one connection per thread, a commit
    for every operation."""

    name = "sqlite3"
    batch = 1
    notes = (
        (
            "WAL, synchronous=NORMAL, one connection per thread; increment and update "
            "read and write in one BEGIN IMMEDIATE transaction; asyncio calls it inline "
            "on the loop's thread (sqlite3 has no asyncio API)"
        ),
    )
    aio = "inline"

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self._path = os.path.join(location, "sqlite3.db")
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._guard = threading.Lock()
        self._conn().execute("CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v)")

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                self._path, isolation_level=None, timeout=60.0, check_same_thread=False
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
            self._local.pending = 0
            with self._guard:
                self._connections.append(conn)
        return conn

    def _run(self, work: Callable[[sqlite3.Connection], Any], write: bool) -> Any:
        """``work`` in a transaction: its own, or every ``batch`` operations one."""
        conn = self._conn()
        if not conn.in_transaction:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            result = work(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            self._local.pending = 0
            raise
        self._local.pending += 1
        if self._local.pending >= self.batch:
            conn.execute("COMMIT")
            self._local.pending = 0
        return result

    def flush(self) -> None:
        conn = self._conn()
        if conn.in_transaction:
            conn.execute("COMMIT")
        self._local.pending = 0

    def set(self, key: str, value: dict[str, Any]) -> None:
        params = (key, json.dumps(value))
        if self.batch == 1:  # one statement: its own transaction
            self._conn().execute(_UPSERT, params)
            return
        self._run(lambda conn: conn.execute(_UPSERT, params), write=True)

    def get(self, key: str) -> Any:
        def read(conn: sqlite3.Connection) -> Any:
            row = conn.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
            return None if row is None else json.loads(row[0])

        if self.batch == 1:
            return read(self._conn())
        return self._run(read, write=False)

    def increment(self, key: str) -> int:
        def add(conn: sqlite3.Connection) -> int:
            if conn.execute("UPDATE kv SET v = v + 1 WHERE k = ?", (key,)).rowcount == 0:
                conn.execute("INSERT INTO kv (k, v) VALUES (?, 1)", (key,))
            return int(conn.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()[0])

        return int(self._run(add, write=True))

    def update(self, key: str) -> Any:
        def change(conn: sqlite3.Connection) -> Any:
            row = conn.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
            value = apply_update(json.loads(row[0]))
            conn.execute("UPDATE kv SET v = ? WHERE k = ?", (json.dumps(value), key))
            return value

        return self._run(change, write=True)

    def delete(self, key: str) -> None:
        if self.batch == 1:
            self._conn().execute(_DELETE, (key,))
            return
        self._run(lambda conn: conn.execute(_DELETE, (key,)), write=True)

    def count(self, key: str) -> int:
        self.flush()
        row = self._conn().execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
        return 0 if row is None else int(row[0])

    async def acall(self, verb: str, *args: Any) -> Any:
        return getattr(self, verb)(*args)

    def close(self) -> None:
        with self._guard:
            connections, self._connections = self._connections, []
        for conn in connections:
            if conn.in_transaction:
                conn.execute("COMMIT")
            conn.close()


class SQLiteBatchPeer(SQLitePeer):
    """Raw sqlite3 as above, committing once every 100 operations per connection."""

    name = "sqlite3x100"
    batch = 100
    notes = (
        (
            "as sqlite3, but each connection commits once per 100 operations (reads too "
            "run in transactions of 100); every phase ends with a commit, which is timed"
        ),
    )


class DiskCachePeer(_KeyValuePeer):
    name = "diskcache"
    notes = ("default settings; increment is Cache.incr; update runs inside Cache.transact()",)

    def __init__(self, location: str) -> None:
        import diskcache  # type: ignore[import-untyped, import-not-found, unused-ignore]

        super().__init__(location)
        self._kv = diskcache.Cache(os.path.join(location, "diskcache"))

    def increment(self, key: str) -> int:
        return int(self._kv.incr(key))

    def update(self, key: str) -> Any:
        cache = self._kv
        with cache.transact():
            value = apply_update(cache.get(key))
            cache.set(key, value)
        return value

    def close(self) -> None:
        self._kv.close()


class SqliteDictPeer(Peer):
    name = "sqlitedict"
    notes = (
        (
            "autocommit=True; it has no atomic increment or update, so both read and write "
            "under a threading.Lock, which does not hold across processes: process counts "
            "may come out short"
        ),
    )

    def __init__(self, location: str) -> None:
        from sqlitedict import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
            SqliteDict,
        )

        super().__init__(location)
        self._dict: Any = SqliteDict(
            os.path.join(location, "sqlitedict.db"), autocommit=True, timeout=60
        )
        self._lock = threading.Lock()

    def set(self, key: str, value: dict[str, Any]) -> None:
        self._dict[key] = value

    def get(self, key: str) -> Any:
        return self._dict.get(key)

    def increment(self, key: str) -> int:
        with self._lock:
            value = int(self._dict.get(key, 0)) + 1
            self._dict[key] = value
            return value

    def update(self, key: str) -> Any:
        with self._lock:
            value = apply_update(self._dict[key])
            self._dict[key] = value
            return value

    def delete(self, key: str) -> None:
        del self._dict[key]

    def count(self, key: str) -> int:
        return int(self._dict.get(key, 0))

    def close(self) -> None:
        self._dict.close()


_UPDATE_SCRIPT = """
local text = redis.call('GET', KEYS[1])
local value = cjson.decode(text)
value['n'] = (value['n'] or 0) + 1
value['name'] = ARGV[1]
value['ok'] = false
text = cjson.encode(value)
redis.call('SET', KEYS[1], text)
return text
"""

REDIS_HOST = "127.0.0.1"
REDIS_PORT = 6379


class RedisPeer(Peer):
    name = "redis"
    notes = (
        (
            f"redis-py to {REDIS_HOST}:{REDIS_PORT}, values as JSON strings; increment is "
            "INCR; update is a Lua script making the three changes atomically; asyncio "
            "uses redis.asyncio; keys under a prefix of their own, deleted afterwards"
        ),
    )
    aio = "redis.asyncio"

    def __init__(self, location: str) -> None:
        import redis

        super().__init__(location)
        digest = hashlib.sha1(os.path.abspath(location).encode(), usedforsecurity=False)
        self._prefix = f"reactor-bench:{digest.hexdigest()[:16]}:"
        self._client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT)
        self._update = self._client.register_script(_UPDATE_SCRIPT)
        self._aclient: Any = None
        self._aupdate: Any = None

    def set(self, key: str, value: dict[str, Any]) -> None:
        self._client.set(self._prefix + key, json.dumps(value))

    def get(self, key: str) -> Any:
        text = self._client.get(self._prefix + key)
        return None if text is None else json.loads(text)

    def increment(self, key: str) -> int:
        return int(self._client.incr(self._prefix + key))

    def update(self, key: str) -> Any:
        return json.loads(self._update(keys=[self._prefix + key], args=[UPDATE_NAME]))

    def delete(self, key: str) -> None:
        self._client.delete(self._prefix + key)

    def count(self, key: str) -> int:
        text = self._client.get(self._prefix + key)
        return 0 if text is None else int(text)

    async def astart(self) -> None:
        import redis.asyncio

        self._aclient = redis.asyncio.Redis(host=REDIS_HOST, port=REDIS_PORT)
        self._aupdate = self._aclient.register_script(_UPDATE_SCRIPT)

    async def astop(self) -> None:
        if self._aclient is not None:
            await self._aclient.aclose()
            self._aclient = None

    async def acall(self, verb: str, *args: Any) -> Any:
        client = self._aclient
        key = self._prefix + args[0]
        if verb == "set":
            return await client.set(key, json.dumps(args[1]))
        if verb == "get":
            text = await client.get(key)
            return None if text is None else json.loads(text)
        if verb == "increment":
            return int(await client.incr(key))
        if verb == "update":
            return json.loads(await self._aupdate(keys=[key], args=[UPDATE_NAME]))
        if verb == "delete":
            return await client.delete(key)
        raise ValueError(verb)

    def cleanup(self) -> None:
        keys = list(self._client.scan_iter(match=self._prefix + "*", count=1000))
        for start in range(0, len(keys), 1000):
            self._client.delete(*keys[start : start + 1000])

    def close(self) -> None:
        self._client.close()


PEERS: dict[str, type[Peer]] = {
    peer.name: peer
    for peer in (
        ReactorPeer,
        DictLockPeer,
        SQLitePeer,
        SQLiteBatchPeer,
        DiskCachePeer,
        SqliteDictPeer,
        RedisPeer,
    )
}


def _redis_answers() -> str | None:
    """None if a Redis server answers a ping within 0.5 s, else why not."""
    import redis

    client = redis.Redis(
        host=REDIS_HOST, port=REDIS_PORT, socket_connect_timeout=0.5, socket_timeout=0.5
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        return f"no Redis server answered at {REDIS_HOST}:{REDIS_PORT} ({exc})"
    finally:
        client.close()
    return None


def redis_server_version() -> str | None:
    """The Redis server's version, if one answers."""
    import redis

    client = redis.Redis(
        host=REDIS_HOST, port=REDIS_PORT, socket_connect_timeout=0.5, socket_timeout=0.5
    )
    try:
        return str(client.info("server").get("redis_version"))
    except redis.RedisError:
        return None
    finally:
        client.close()


def available(wanted: tuple[str, ...] | None = None) -> tuple[list[str], dict[str, str]]:
    """The peers that can run here (reactor and those ``wanted``; None: every one), and
    for each one that cannot, why."""
    modules = {"diskcache": "diskcache", "sqlitedict": "sqlitedict", "redis": "redis"}
    names: list[str] = []
    skipped: dict[str, str] = {}
    for name in PEERS:
        if wanted is not None and name != ReactorPeer.name and name not in wanted:
            continue
        module = modules.get(name)
        if module is not None:
            try:
                __import__(module)
            except ImportError:
                skipped[name] = f"{module} is not installed (pip install reactor-state[bench])"
                continue
        if name == "redis":
            reason = _redis_answers()
            if reason is not None:
                skipped[name] = reason
                continue
        names.append(name)
    return names, skipped
