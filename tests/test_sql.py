"""The statements both SQL backends share (``_sql``): every name they look up is in
brackets, which each backend reads its own way (``_postgres``)."""

from __future__ import annotations

import re

import pytest

from reactor import _postgres, _sql

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
    converted = _postgres._pg(sql)
    assert not re.search(r"\[\w", converted), converted
