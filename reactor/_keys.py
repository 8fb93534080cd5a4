"""Keys, scope names and glob patterns.

Patterns follow Redis ``KEYS``: ``*``, ``?``, ``[abc]``, ``[a-z]``, ``[!a]`` (or
``[^a]``) and ``\\`` to escape. A pattern never reaches SQL as a pattern: the store
narrows a query to the pattern's literal prefix with a plain range comparison, and
the compiled regular expression below decides every match.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Final

from .errors import InvalidKeyError

__all__ = ["Pattern", "check_key", "compile_pattern"]

MAX_KEY_LENGTH: Final = 1024
_LAST_CODE_POINT: Final = 0x10FFFF


def check_key(key: object, what: str = "key") -> str:
    """Return ``key`` if it is a valid key or scope name.

    Raises:
        InvalidKeyError: not a ``str``, empty, longer than 1,024 characters, or holding
            NUL or a lone surrogate (neither can be stored on every backend).
    """
    if type(key) is not str:
        raise InvalidKeyError(f"a {what} must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidKeyError(f"a {what} must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKeyError(
            f"a {what} is at most {MAX_KEY_LENGTH} characters, this one has {len(key)}"
        )
    if not key.isascii():
        try:
            key.encode()
        except UnicodeEncodeError:
            raise InvalidKeyError(f"{what} {key!r} holds a lone surrogate") from None
    if "\x00" in key:
        raise InvalidKeyError(f"{what} {key!r} holds a NUL character")
    return key


@dataclass(frozen=True, slots=True)
class Pattern:
    """A compiled glob: the literal prefix every match starts with, and the matcher."""

    text: str
    prefix: str
    exact: bool
    regex: re.Pattern[str]

    def matches(self, key: str) -> bool:
        if self.exact:
            return key == self.prefix
        return self.regex.fullmatch(key) is not None

    @property
    def matches_all(self) -> bool:
        return self.text == "*"

    def bounds(self) -> tuple[str, str | None] | None:
        """The half-open range ``[low, high)`` holding every match, or None for all.

        ``high`` is None when no string above the prefix exists.
        """
        if not self.prefix:
            return None
        return self.prefix, _successor(self.prefix)


def _successor(prefix: str) -> str | None:
    """The least string greater than every string that starts with ``prefix``."""
    chars = list(prefix)
    while chars:
        last = ord(chars.pop())
        following = last + 1
        if 0xD800 <= following <= 0xDFFF:  # skip the surrogate block
            following = 0xE000
        if following <= _LAST_CODE_POINT:
            return "".join(chars) + chr(following)
    return None


@functools.lru_cache(maxsize=512)
def compile_pattern(pattern: str) -> Pattern:
    """Compile a Redis-style glob.

    Raises:
        InvalidKeyError: the pattern is not a non-empty ``str``.
    """
    if type(pattern) is not str or not pattern:
        raise InvalidKeyError(f"a pattern must be a non-empty str, not {pattern!r}")
    parts: list[str] = []
    prefix: list[str] = []
    literal_so_far = True
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        if char == "\\" and i + 1 < n:
            parts.append(re.escape(pattern[i + 1]))
            if literal_so_far:
                prefix.append(pattern[i + 1])
            i += 2
            continue
        if char == "*":
            parts.append(".*")
        elif char == "?":
            parts.append(".")
        elif char == "[" and (end := _class_end(pattern, i)) is not None:
            parts.append(_class_regex(pattern[i + 1 : end]))
            i = end + 1
            literal_so_far = False
            continue
        else:
            parts.append(re.escape(char))
            if literal_so_far:
                prefix.append(char)
            i += 1
            continue
        literal_so_far = False
        i += 1
    return Pattern(
        text=pattern,
        prefix="".join(prefix),
        exact=literal_so_far,
        regex=re.compile("".join(parts), re.DOTALL),
    )


def _class_end(pattern: str, start: int) -> int | None:
    """Index of the ``]`` closing the class opened at ``start``; None if unclosed."""
    i = start + 1
    if i < len(pattern) and pattern[i] in "!^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":  # a leading ] is a member
        i += 1
    while i < len(pattern):
        if pattern[i] == "\\":
            i += 2
            continue
        if pattern[i] == "]":
            return i
        i += 1
    return None


def _class_regex(body: str) -> str:
    negate = body[:1] in ("!", "^")
    if negate:
        body = body[1:]
    members: list[str] = []
    i = 0
    while i < len(body):
        char = body[i]
        if char == "\\" and i + 1 < len(body):
            char = body[i + 1]
            i += 1
        if i + 2 < len(body) and body[i + 1] == "-":
            high = body[i + 2]
            if high == "\\" and i + 3 < len(body):
                high = body[i + 3]
                i += 1
            low, high = sorted((char, high))
            members.append(f"{re.escape(low)}-{re.escape(high)}")
            i += 3
            continue
        members.append(re.escape(char))
        i += 1
    if not members:
        return "[^\\s\\S]" if not negate else "[\\s\\S]"
    return f"[{'^' if negate else ''}{''.join(members)}]"
