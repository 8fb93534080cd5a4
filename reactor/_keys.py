"""Keys, scope names and glob patterns.

Patterns are matched exactly as Redis ``KEYS`` matches them (``stringmatchlen`` in its
``src/util.c``, as Redis 7.0.15 with its security fixes runs it on x86-64), on the UTF-8
bytes of the pattern and of the key, plus one extension: ``[!`` opens a negated class
like ``[^``.

- ``*`` matches any run of bytes; ``?`` one byte; ``\\x`` the byte ``x`` (a trailing
  ``\\`` is itself).
- ``[`` opens a class matching one byte, negated by a ``^`` (or ``!``) right after it.
  Inside, ``\\x`` is the byte ``x``; ``a-z`` is a range (reversed ends are swapped) taken
  whenever two more bytes follow the start, so its end may be ``]`` or ``\\``; ``]``
  closes the class, even first (``[]`` matches nothing, ``[^]`` any byte); a class left
  open runs to the end of the pattern.
- Range ends compare as *signed* bytes, as C's ``char`` on x86-64: ``[a-\\xc3]`` holds
  the bytes up to ``a`` and from ``\\xc3`` up, not those between.
- A pattern with more than 1,000 runs of ``*`` matches nothing, unless the 1,001st is
  its last character (Redis's guard against abusive patterns, CVE-2024-31228).

Matching on bytes, as Redis does, means ``?`` and a class match one byte of a
multi-byte character: ``??`` matches ``é``, ``?`` does not.

A pattern never reaches SQL as a pattern: the store narrows a query to the pattern's
literal prefix with a plain range comparison (:meth:`Pattern.bounds`), and
:meth:`Pattern.matches` decides every match. Stars split a pattern into fixed-length
segments; placing each middle segment at its leftmost occurrence is enough, so a match
costs one left-to-right search per segment and no pattern can backtrack without bound.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from .errors import InvalidKeyError

__all__ = ["Pattern", "check_key", "compile_pattern"]

MAX_KEY_LENGTH: Final = 1024
_LAST_CODE_POINT: Final = 0x10FFFF

_STAR: Final = ord("*")
_QUESTION: Final = ord("?")
_OPEN: Final = ord("[")
_CLOSE: Final = ord("]")
_ESCAPE: Final = ord("\\")
_DASH: Final = ord("-")
_NEGATIONS: Final = (ord("^"), ord("!"))  # "!" is reactor's extension; Redis has "^" only
_ANY_BYTE: Final = frozenset(range(256))
# Redis gives up, answering "no match", where a star would nest deeper than 1,000 stars
# (CVE-2024-31228): a pattern whose 1,001st run of stars is not its end matches nothing.
_MAX_STARS: Final = 1000

# A token is one pattern element: None for "*", an int for a literal byte, a frozenset
# for a byte class ("?" is the class of every byte).
_Token = int | frozenset[int] | None
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


def compile_pattern(pattern: object) -> Pattern:
    """Compile a Redis-style glob.

    Raises:
        InvalidKeyError: the pattern is not a non-empty ``str``.
    """
    # Checked before the cache, which would raise TypeError on an unhashable argument.
    if type(pattern) is not str or not pattern:
        raise InvalidKeyError(f"a pattern must be a non-empty str, not {pattern!r}")
    return _compile(pattern)


@functools.lru_cache(maxsize=512)
def _compile(text: str) -> Pattern:
    # surrogatepass: a pattern may hold anything; a lone surrogate then matches no key.
    tokens = _tokenize(text.encode("utf-8", "surrogatepass"))
    literal = bytearray()
    for token in tokens:
        if not isinstance(token, int):
            break
        literal.append(token)
    prefix = _whole_characters(bytes(literal))
    if len(literal) == len(tokens) and prefix.encode() == literal:
        return Pattern(text, prefix, exact=True, matcher=prefix.__eq__)
    segments: list[list[int | frozenset[int]]] = [[]]
    for token in tokens:
        if token is None:
            segments.append([])
        else:
            segments[-1].append(token)
    matches_all = all(token is None for token in tokens)
    stars = [i for i, token in enumerate(tokens) if token is None]
    if len(stars) > _MAX_STARS and stars[_MAX_STARS] != len(tokens) - 1:
        return Pattern(text, prefix, exact=False, matcher=_no_key)
    return Pattern(text, prefix, exact=False, matcher=_matcher(segments), matches_all=matches_all)


def _no_key(_key: str) -> bool:
    return False


def _tokenize(pattern: bytes) -> list[_Token]:
    """Read a pattern as Redis's ``stringmatchlen`` reads it."""
    tokens: list[_Token] = []
    i, n = 0, len(pattern)
    while i < n:
        byte = pattern[i]
        if byte == _STAR:
            if not tokens or tokens[-1] is not None:  # "**" is "*"
                tokens.append(None)
            i += 1
        elif byte == _QUESTION:
            tokens.append(_ANY_BYTE)
            i += 1
        elif byte == _OPEN:
            members, i = _read_class(pattern, i + 1)
            tokens.append(members)
        elif byte == _ESCAPE and i + 1 < n:
            tokens.append(pattern[i + 1])
            i += 2
        else:
            tokens.append(byte)
            i += 1
    return tokens


def _read_class(pattern: bytes, i: int) -> tuple[frozenset[int], int]:
    """The bytes of the class whose body starts at ``i``, and the index after it."""
    n = len(pattern)
    negate = i < n and pattern[i] in _NEGATIONS
    if negate:
        i += 1
    members: set[int] = set()
    while i < n:  # an unterminated class runs to the end of the pattern
        byte = pattern[i]
        if byte == _ESCAPE and i + 1 < n:
            members.add(pattern[i + 1])
            i += 2
        elif byte == _CLOSE:
            i += 1
            break
        elif i + 2 < n and pattern[i + 1] == _DASH:
            # Redis takes a range whenever two bytes follow the start, so "[a-]" is the
            # range from "a" to "]" (left open), and "\" ends a range unescaped.
            low, high = sorted((_signed(byte), _signed(pattern[i + 2])))
            members.update(b for b in range(256) if low <= _signed(b) <= high)
            i += 3
        else:
            members.add(byte)
            i += 1
    return (_ANY_BYTE - members if negate else frozenset(members)), i


def _signed(byte: int) -> int:
    """The byte as x86-64 C compares a ``char``: 0x80 to 0xFF are negative."""
    return byte - 256 if byte >= 0x80 else byte


def _whole_characters(data: bytes) -> str:
    """``data`` decoded, cut back to the last whole character."""
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        return data[: exc.start].decode()


def _matcher(segments: list[list[int | frozenset[int]]]) -> _Matcher:
    """A function telling whether a key matches; ``segments`` lie between the stars."""
    literals = [bytes(t for t in segment if isinstance(t, int)) for segment in segments]
    texts = [_whole_characters(literal) for literal in literals]
    if len(segments) > 1 and all(
        len(literal) == len(segment) and text.encode() == literal
        for segment, literal, text in zip(segments, literals, texts, strict=True)
    ):
        # Only whole characters between the stars: found among the key's characters,
        # they are found at the same places among its bytes, so the key needs no encoding.
        return _text_matcher(texts)
    return _byte_matcher([_segment_regex(segment) for segment in segments])


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


def _byte_matcher(segments: list[tuple[re.Pattern[bytes], int]]) -> _Matcher:
    if len(segments) == 1:
        regex, _ = segments[0]
        return lambda key: regex.fullmatch(key.encode("utf-8", "surrogatepass")) is not None
    (head, head_size), *middle, (tail, tail_size) = segments
    least = head_size + sum(size for _, size in middle) + tail_size
    if not middle and not tail_size:
        return lambda key: head.match(key.encode("utf-8", "surrogatepass")) is not None

    def matches(key: str) -> bool:
        data = key.encode("utf-8", "surrogatepass")
        end = len(data) - tail_size
        if len(data) < least or not head.match(data) or not tail.match(data, end):
            return False
        at = head_size
        for regex, _ in middle:  # the leftmost place of each segment leaves the most room
            found = regex.search(data, at, end)
            if found is None:
                return False
            at = found.end()
        return True

    return matches


def _segment_regex(segment: list[int | frozenset[int]]) -> tuple[re.Pattern[bytes], int]:
    """A regular expression of fixed length (no star), and that length."""
    parts: list[bytes] = []
    for token in segment:
        if isinstance(token, int):
            parts.append(re.escape(bytes([token])))
        elif token == _ANY_BYTE:
            parts.append(b".")
        elif not token:
            parts.append(b"(?!)")
        else:
            parts.append(b"[" + b"".join(_byte_ranges(token)) + b"]")
    return re.compile(b"".join(parts), re.DOTALL), len(segment)


def _byte_ranges(members: frozenset[int]) -> list[bytes]:
    ranges: list[bytes] = []
    ordered = sorted(members)
    start = previous = ordered[0]
    for byte in [*ordered[1:], None]:
        if byte is not None and byte == previous + 1:
            previous = byte
            continue
        ranges.append(b"\\x%02x-\\x%02x" % (start, previous))
        if byte is not None:
            start = previous = byte
    return ranges
