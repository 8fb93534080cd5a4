"""The commit of a transaction body (``with scope.transaction()``,
``state.transaction(...)``): it applies what the body staged only if no other process
changed the body's scopes, or the expiry of a key the body read, since the body began;
otherwise ``ConflictError`` and nothing applied."""

from __future__ import annotations

from reactor._storage.txn import WriteTxn
from reactor.errors import ConflictError

from .writes import Work

__all__ = ["checked_commit"]


def checked_commit(
    scopes: tuple[str, ...],
    pending: WriteTxn,
    base: int,
    deadlines: dict[tuple[str, str], float | None],
) -> Work[None]:
    """The work that commits ``pending`` (staged by a body that began at revision
    ``base`` and read keys with ``deadlines``) over ``scopes``, if nothing changed.

    Raises (from the work):
        ConflictError: another process changed a scope meanwhile.
    """

    def work(txn: WriteTxn) -> None:
        changed = next(
            (scope for scope in scopes if txn.statements.changed_since(scope, base)), None
        )
        if changed is None:
            changed = _deadline_moved(txn, deadlines)
        if changed is not None:
            raise ConflictError(
                f"another process changed scope {changed!r} during this transaction; "
                "nothing of it was applied"
            )
        txn.adopt(pending, deadlines)

    return Work(work)


def _deadline_moved(txn: WriteTxn, deadlines: dict[tuple[str, str], float | None]) -> str | None:
    """The scope of a key the body read whose expiry another process changed (``expire``,
    or a same-value ``set`` with a new ttl): no change-log record tells of that."""
    by_scope: dict[str, list[str]] = {}
    for scope, key in deadlines:
        by_scope.setdefault(scope, []).append(key)
    for scope, keys in by_scope.items():
        rows = txn.statements.fetch_many(scope, keys)
        for key in keys:
            row = rows.get(key)
            if (None if row is None else row.expires_at) != deadlines[(scope, key)]:
                return scope
    return None
