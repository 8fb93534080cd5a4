"""Argument checks shared by several verbs, so that each bad input gets one wording."""

from __future__ import annotations

import math

from reactor.errors import InvalidArgumentError

__all__ = ["check_timeout"]


def check_timeout(timeout: object) -> float | None:
    """How long a wait may last, in seconds (None: no limit, as is infinity or an int
    too large for a float: longer than anyone waits).

    Raises:
        InvalidArgumentError: not None nor a number >= 0.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise InvalidArgumentError(f"timeout must be None or a number >= 0, not {timeout!r}")
    try:
        seconds = float(timeout)
    except OverflowError:
        return None
    return None if math.isinf(seconds) else seconds
