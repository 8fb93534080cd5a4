"""The systems ``reactor bench`` measures, each behind the adapter of ``peer``."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from typing import Any

from .peer import UPDATE_NAME, Peer, apply_update, reactor_target
from .sqlite_peers import SQLiteBatchPeer, SQLiteFloorPeer, SQLitePeer

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
        SQLiteFloorPeer,
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
