"""Keys, scope names (and the prefixes reserved for reactor's own events) and glob
patterns.

Patterns follow Redis ``KEYS`` (``stringmatchlen`` in its ``src/util.c``, as Redis
7.0.15 with its security fixes runs it), read on characters (code points) where Redis
reads bytes, plus one extension: ``[!`` opens a negated class like ``[^``.

- ``*`` matches any run of characters; ``?`` one character; ``\\x`` the character ``x``
  (a trailing ``\\`` is itself).
- ``[`` opens a class matching one character, negated by a ``^`` (or ``!``) right after
  it. Inside, ``\\x`` is the character ``x``; ``a-z`` is the range of the code points
  from ``a`` to ``z`` (reversed ends are swapped) taken whenever two more characters
  follow the start, so its end may be ``]`` or ``\\``; ``]`` closes the class, even
  first (``[]`` matches nothing, ``[^]`` any character); a class left open runs to the
  end of the pattern.
- A pattern with more than 1,000 runs of ``*`` matches nothing, unless the 1,001st is
  its last character (Redis's guard against abusive patterns, CVE-2024-31228).

Why characters: keys are ``str``, so ``?`` matching ``é`` (one code point) is what a
caller means, where Redis's bytes would need ``??`` and split ``[é]`` into the two bytes
of its UTF-8 form. On ASCII, a byte and a code point are the same number below 0x80, so
every rule above reads exactly as Redis reads it. No normalization: ``e`` followed by a
combining accent is two characters, as ``str`` counts them. A class is kept as sorted
ranges of code points and compiled to a ``re`` class, never as a set of members. A NUL
or a lone surrogate in a pattern is kept as written; no key holds one (see
:func:`check_key`), so a pattern that needs one matches nothing.

A pattern never reaches SQL as a pattern: the store narrows a query to the pattern's
literal prefix with a plain range comparison (:meth:`Pattern.bounds`; every backend
orders keys by code point), and :meth:`Pattern.matches` decides every match. Stars split
a pattern into fixed-length segments; placing each middle segment at its leftmost
occurrence is enough, so a match costs one left-to-right search per segment and no
pattern can backtrack without bound.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Final

from reactor.errors import InvalidKeyError

__all__ = [
    "QUEUE_PREFIX",
    "RESERVED_PREFIXES",
    "RUN_PREFIX",
    "Globs",
    "Pattern",
    "check_key",
    "check_writable",
    "compile_globs",
    "compile_pattern",
    "successor",
]

MAX_KEY_LENGTH: Final = 1024
# The scopes of the events reactor records itself: a queue's jobs (SPEC §13) under
# "queue:NAME", a workflow's runs (§14) under "run:WORKFLOW". Users read them, and never
# write there: their own keys would mix with those events (in history, at_revision,
# wait_for) and their transactions would conflict with the queue's activity.
QUEUE_PREFIX: Final = "queue:"
RUN_PREFIX: Final = "run:"
RESERVED_PREFIXES: Final = (QUEUE_PREFIX, RUN_PREFIX)
# A filter's scope or key: a glob, or a list of them (any one matching will do).
Globs = str | Collection[str]
_LAST_CODE_POINT: Final = 0x10FFFF

_NEGATIONS: Final = "^!"  # "!" is reactor's extension; Redis has "^" only
# Redis gives up, answering "no match", where a star would nest deeper than 1,000 stars
# (CVE-2024-31228): a pattern whose 1,001st run of stars is not its end matches nothing.
_MAX_STARS: Final = 1000

# A class: sorted, disjoint, non-adjacent ranges of code points, ends included. Ranges,
# not sets of members: "[^a]" holds 1,114,111 code points.
_Ranges = tuple[tuple[int, int], ...]
_ANY_CHARACTER: Final[_Ranges] = ((0, _LAST_CODE_POINT),)
# A token is one pattern element: None for "*", a str of one character for a literal,
# the ranges of a class ("?" is the class of every character).
_Token = str | _Ranges | None
_Matcher = Callable[[str], bool]


def check_key(key: object, what: str = "key") -> str:
    """Return ``key`` if it is a valid key or scope name.

    Raises:
        InvalidKeyError: not a ``str``, empty, longer than 1,024 characters, or holding
            NUL or a lone surrogate (neither can be stored on every backend).
    """
    article = "an" if what[0] in "aeiou" else "a"
    if type(key) is not str:
        raise InvalidKeyError(f"{article} {what} must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidKeyError(f"{article} {what} must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKeyError(
            f"{article} {what} is at most {MAX_KEY_LENGTH} characters, this one has {len(key)}"
        )
    if not key.isascii():
        try:
            key.encode()
        except UnicodeEncodeError:
            raise InvalidKeyError(f"{what} {key!r} holds a lone surrogate") from None
    if "\x00" in key:
        raise InvalidKeyError(f"{what} {key!r} holds a NUL character")
    return key


def check_writable(scope: str) -> str:
    """Return ``scope`` (a valid scope name) if users may write to it: one ``startswith``,
    run once per write call, whatever the keys.

    Raises:
        InvalidKeyError: its name begins with a reserved prefix (``queue:``, ``run:``).
    """
    if scope.startswith(RESERVED_PREFIXES):
        raise InvalidKeyError(
            f"cannot write to scope {scope!r}: scope names beginning with 'queue:' or 'run:' "
            "are reserved for the events of queues and workflow runs"
        )
    return scope


@dataclass(frozen=True, slots=True)
class Pattern:
    """A compiled glob: the literal prefix every match starts with, and the matcher.

    ``exact`` is true when the pattern has no wildcard: it matches ``prefix`` only.
    """

    text: str
    prefix: str
    exact: bool
    matcher: _Matcher = field(repr=False, compare=False)
    matches_all: bool = False

    def matches(self, key: str) -> bool:
        if self.exact:
            return key == self.prefix
        return self.matcher(key)

    def bounds(self) -> tuple[str, str | None] | None:
        """The half-open range ``[low, high)`` holding every match, or None for all.

        ``high`` is None when no string above the prefix exists.
        """
        if not self.prefix:
            return None
        return self.prefix, successor(self.prefix)


def successor(prefix: str) -> str | None:
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


def compile_pattern(pattern: object) -> Pattern:
    """Compile a Redis-style glob.

    Raises:
        InvalidKeyError: the pattern is not a non-empty ``str``.
    """
    # Checked before the cache, which would raise TypeError on an unhashable argument.
    if type(pattern) is not str or not pattern:
        raise InvalidKeyError(f"a pattern must be a non-empty str, not {pattern!r}")
    return _compile(pattern)


def compile_globs(globs: object) -> Pattern:
    """Compile a glob, or several (a list, tuple or set of them) into one pattern that a
    string matches when any of them does: a glob has no alternation (``|`` is a
    character like any other, as in Redis), so a filter on two scopes lists both.

    Raises:
        InvalidKeyError: not a non-empty ``str``, nor a non-empty list of them.
    """
    if type(globs) is str:
        return compile_pattern(globs)
    if not isinstance(globs, list | tuple | set | frozenset) or not globs:
        raise InvalidKeyError(
            f"a pattern must be a non-empty str, or a non-empty list of them, not {globs!r}"
        )
    patterns = tuple(compile_pattern(glob) for glob in globs)
    if len(patterns) == 1:
        return patterns[0]
    return Pattern(
        repr([pattern.text for pattern in patterns]),
        os.path.commonprefix([pattern.prefix for pattern in patterns]),  # noqa: RUF071 - by character
        exact=False,
        matcher=lambda key: any(pattern.matches(key) for pattern in patterns),
        matches_all=any(pattern.matches_all for pattern in patterns),
    )


@functools.lru_cache(maxsize=512)
def _compile(text: str) -> Pattern:
    tokens = _tokenize(text)
    literal: list[str] = []
    for token in tokens:
        if not isinstance(token, str) or not _storable(token):
            break
        literal.append(token)
    # The prefix stops before a character no key holds: it reaches SQL as a bound, where
    # PostgreSQL refuses a NUL and no driver encodes a lone surrogate.
    prefix = "".join(literal)
    if len(literal) == len(tokens):
        return Pattern(text, prefix, exact=True, matcher=prefix.__eq__)
    stars = [i for i, token in enumerate(tokens) if token is None]
    too_many_stars = len(stars) > _MAX_STARS and stars[_MAX_STARS] != len(tokens) - 1
    # Every match holds each literal character: one that no key holds matches nothing.
    needs_unstorable = any(isinstance(token, str) and not _storable(token) for token in tokens)
    if too_many_stars or needs_unstorable:
        return Pattern(text, prefix, exact=False, matcher=_no_key)
    segments: list[list[str | _Ranges]] = [[]]
    for token in tokens:
        if token is None:
            segments.append([])
        else:
            segments[-1].append(token)
    matches_all = len(stars) == len(tokens)
    return Pattern(text, prefix, exact=False, matcher=_matcher(segments), matches_all=matches_all)


def _storable(char: str) -> bool:
    """Whether a key may hold ``char`` (:func:`check_key`): not NUL, not a surrogate."""
    return char != "\x00" and not "\ud800" <= char <= "\udfff"


def _no_key(_key: str) -> bool:
    return False


def _tokenize(pattern: str) -> list[_Token]:
    """Read a pattern as Redis's ``stringmatchlen`` reads it, by characters."""
    tokens: list[_Token] = []
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        if char == "*":
            if not tokens or tokens[-1] is not None:  # "**" is "*"
                tokens.append(None)
            i += 1
        elif char == "?":
            tokens.append(_ANY_CHARACTER)
            i += 1
        elif char == "[":
            ranges, i = _read_class(pattern, i + 1)
            tokens.append(ranges)
        elif char == "\\" and i + 1 < n:
            tokens.append(pattern[i + 1])
            i += 2
        else:
            tokens.append(char)
            i += 1
    return tokens


def _read_class(pattern: str, i: int) -> tuple[_Ranges, int]:
    """The class whose body starts at ``i``, and the index after it."""
    n = len(pattern)
    negate = i < n and pattern[i] in _NEGATIONS
    if negate:
        i += 1
    spans: list[tuple[int, int]] = []
    while i < n:  # an unterminated class runs to the end of the pattern
        char = pattern[i]
        if char == "\\" and i + 1 < n:
            spans.append((ord(pattern[i + 1]),) * 2)
            i += 2
        elif char == "]":
            i += 1
            break
        elif i + 2 < n and pattern[i + 1] == "-":
            # Redis takes a range whenever two characters follow the start, so "[a-]" is
            # the range from "]" to "a" (left open), and "\" ends a range unescaped.
            low, high = sorted((ord(char), ord(pattern[i + 2])))
            spans.append((low, high))
            i += 3
        else:
            spans.append((ord(char),) * 2)
            i += 1
    ranges = _merged(spans)
    return (_complement(ranges) if negate else ranges), i


def _merged(spans: list[tuple[int, int]]) -> _Ranges:
    ranges: list[tuple[int, int]] = []
    for low, high in sorted(spans):
        if ranges and low <= ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], max(high, ranges[-1][1]))
        else:
            ranges.append((low, high))
    return tuple(ranges)


def _complement(ranges: _Ranges) -> _Ranges:
    gaps: list[tuple[int, int]] = []
    start = 0
    for low, high in ranges:
        if low > start:
            gaps.append((start, low - 1))
        start = high + 1
    if start <= _LAST_CODE_POINT:
        gaps.append((start, _LAST_CODE_POINT))
    return tuple(gaps)


def _matcher(segments: list[list[str | _Ranges]]) -> _Matcher:
    """A function telling whether a key matches; ``segments`` lie between the stars."""
    if len(segments) > 1 and all(isinstance(t, str) for segment in segments for t in segment):
        return _text_matcher(["".join(map(str, segment)) for segment in segments])
    return _regex_matcher([_segment_regex(segment) for segment in segments])


def _text_matcher(texts: list[str]) -> _Matcher:
    head, *middle, tail = texts
    if not head and not middle and not tail:
        return lambda _key: True
    if not middle and not tail:
        return lambda key: key.startswith(head)
    if not middle and not head:
        return lambda key: key.endswith(tail)
    if len(middle) == 1 and not head and not tail:
        only = middle[0]
        return lambda key: only in key
    least = len(head) + sum(map(len, middle)) + len(tail)

    def matches(key: str) -> bool:
        if len(key) < least or not key.startswith(head) or not key.endswith(tail):
            return False
        at, end = len(head), len(key) - len(tail)
        for text in middle:
            at = key.find(text, at, end)
            if at < 0:
                return False
            at += len(text)
        return True

    return matches


def _regex_matcher(segments: list[tuple[re.Pattern[str], int]]) -> _Matcher:
    if len(segments) == 1:
        regex, _ = segments[0]
        return lambda key: regex.fullmatch(key) is not None
    (head, head_size), *middle, (tail, tail_size) = segments
    least = head_size + sum(size for _, size in middle) + tail_size
    if not middle and not tail_size:
        return lambda key: head.match(key) is not None

    def matches(key: str) -> bool:
        end = len(key) - tail_size
        if len(key) < least or not head.match(key) or not tail.match(key, end):
            return False
        at = head_size
        for regex, _ in middle:  # the leftmost place of each segment leaves the most room
            found = regex.search(key, at, end)
            if found is None:
                return False
            at = found.end()
        return True

    return matches


def _segment_regex(segment: list[str | _Ranges]) -> tuple[re.Pattern[str], int]:
    """A regular expression of fixed length (no star), and that length."""
    parts: list[str] = []
    for token in segment:
        if isinstance(token, str):
            parts.append(re.escape(token))
        elif token == _ANY_CHARACTER:
            parts.append(".")
        elif not token:
            parts.append("(?!)")
        else:
            parts.append("[" + "".join(map(_regex_range, token)) + "]")
    return re.compile("".join(parts), re.DOTALL), len(segment)


def _regex_range(ends: tuple[int, int]) -> str:
    """A range of a ``re`` class, its ends written as escapes (no character is special)."""
    low, high = ends
    if low == high:
        return f"\\U{low:08x}"
    return f"\\U{low:08x}-\\U{high:08x}"
