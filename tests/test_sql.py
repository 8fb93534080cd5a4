"""The statements both SQL backends share (``_sql``): every name they look up is in
brackets, which PostgreSQL turns into the form its indexes hold (``_postgres``)."""

from __future__ import annotations

import re

import pytest

from reactor._storage import postgres_text as _postgres
from reactor._storage import sql_text as _sql
from reactor._storage.schema import NAME_INDEXED

# A name column compared, or named as unique, without brackets; "name = '...'" is the
# name of a row of reactor_meta, not a user's name.
_BARE = re.compile(r"(?<![\[\w.])(?:\w+\.)?(scope|key|name|queue)\s*(=(?! ')|>=|<=|<|>|IN\b)")
_BARE_RIGHT = re.compile(r"(?:=|>=|<=|<|>)\s*(?:\w+\.)?(scope|key|name|queue)\b")
_BARE_CONFLICT = re.compile(r"ON CONFLICT \([^)]*(?<!\[)\b(scope|key|name)\b(?!\])")

STATEMENTS = {
    name: value
    for name, value in vars(_sql).items()
    if name.isupper() and isinstance(value, str) and "reactor_" in value
}


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_every_name_a_statement_looks_up_is_in_brackets(name: str) -> None:
    sql = STATEMENTS[name]
    assert not _BARE.search(sql), sql
    assert not _BARE_RIGHT.search(sql), sql
    assert not _BARE_CONFLICT.search(sql), sql
    converted = _postgres.pg(sql)
    assert not re.search(r"\[\w", converted), converted


def test_the_statements_of_postgresql_alone_compare_names_as_indexed() -> None:
    for sql in (_postgres.CHANGES, _postgres.ROWS_ONLY, _postgres.READ_AHEAD):
        assert not re.search(r"\[\w", sql), sql
        assert "reactor_name(k.key)" in sql


def test_names_compared_with_placeholders_take_their_indexed_form() -> None:
    assert _postgres.pg("SELECT 1 FROM t WHERE [scope] = ? AND [key] IN (?, ?)") == (
        "SELECT 1 FROM t WHERE reactor_name(scope) = reactor_name(%s) "
        "AND reactor_name(key) IN (reactor_name(%s), reactor_name(%s))"
    )
    # A bound is compared as it is: ranged() gives none longer than NAME_INDEXED.
    assert _postgres.pg("WHERE [key] >= ? AND [key] < ?") == (
        "WHERE reactor_name(key) >= %s AND reactor_name(key) < %s"
    )
    assert _postgres.pg("WHERE j.[queue] = q.[name] ON CONFLICT ([name], revision)") == (
        "WHERE reactor_name(j.queue) = reactor_name(q.name) "
        "ON CONFLICT (reactor_name(name), revision)"
    )


LONG_LOW = "a" * 600
CUT = "a" * NAME_INDEXED


@pytest.mark.parametrize(
    ("bounds", "params"),
    [
        (None, ()),
        (("a", "b"), ("a", "b")),
        ((CUT, CUT[:-1] + "b"), (CUT, CUT[:-1] + "b")),
        ((LONG_LOW, LONG_LOW[:-1] + "b"), (CUT, CUT[:-1] + "b")),  # a wider range
        (("\U0010ffff" * 600, None), ("\U0010ffff" * NAME_INDEXED,)),
    ],
)
def test_ranges_of_long_prefixes_widen_to_their_indexed_characters(
    bounds: tuple[str, str | None] | None, params: tuple[str, ...]
) -> None:
    sql, given = _sql.ranged(_sql.KEYS, "s", bounds, 1.0)
    assert given == ("s", 1.0, *params)
    assert sql == _sql.KEYS + (_sql.RANGE if params else "") + (
        _sql.RANGE_END if len(params) == 2 else ""
    )
