"""Who may reach the dashboard, and who may write through it.

Reads are open to whatever can connect; the server binds a loopback address unless told
otherwise. The ``Host`` header must name the server by a name it answers to (Starlette's
``TrustedHostMiddleware``), which defeats DNS rebinding: a page on another site whose
name was re-pointed at 127.0.0.1 sends its own name as the host, and is refused. The
refusal says how to allow a name (``--allow-host``), and so does the server's log, once
per name.

A write is refused unless the server was started with ``--write``, and unless the
request carries ``Content-Type: application/json`` and ``X-Reactor-UI: 1``. A page on
another site cannot send either without a CORS preflight, which this server never
grants, and a plain HTML form can send neither: a cross-site request cannot write.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from collections.abc import Iterable, Sequence
from typing import Final

from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "HEADER",
    "LOOPBACK_NAMES",
    "HostGuard",
    "allowed_hosts",
    "host_refusal",
    "is_loopback",
    "write_refusal",
]

# uvicorn's logger for what is not an access: where the server's own messages go.
logger = logging.getLogger("uvicorn.error")

HEADER: Final = "X-Reactor-UI"
LOOPBACK_NAMES: Final = ("127.0.0.1", "localhost", "::1", "[::1]")
_WILDCARDS: Final = ("", "0.0.0.0", "::")  # noqa: S104 - names, not a bind
# A name safe to repeat in a refusal and a log line (anything else is shown as NAME).
_PLAIN_NAME: Final = re.compile(r"[a-z0-9][a-z0-9.-]{0,252}|\[[0-9a-f:.]{2,45}\]")
_LOGGED_MAX: Final = 64  # refused names logged, at most: a flood of names logs no more


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is reachable from this machine only."""
    name = host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_hosts(bind: str, extra: Iterable[str] = ()) -> list[str]:
    """The names the ``Host`` header may carry for a server bound to ``bind``: the
    loopback names, the bound address, and this machine's names when it listens beyond
    loopback; ``extra`` adds more (``*`` admits any)."""
    names = list(LOOPBACK_NAMES)
    if bind not in _WILDCARDS:
        names.append(bind if ":" not in bind else f"[{bind.strip('[]')}]")
    if not is_loopback(bind):
        names.append(socket.gethostname())  # not getfqdn(): it may wait on DNS
    names += list(extra)
    return list(dict.fromkeys(names))


def write_refusal(request: Request, writable: bool) -> str | None:
    """Why this write request is refused, or None if it may go ahead."""
    if not writable:
        return "the dashboard is read-only: start it with 'reactor ui --write' to change values"
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        return "a write must be sent as Content-Type: application/json"
    if request.headers.get(HEADER) != "1":
        return f"a write must carry the header {HEADER}: 1 (sent by the dashboard's page)"
    origin = request.headers.get("origin")
    if origin is not None and origin.partition("://")[2] != request.headers.get("host"):
        return f"a write from another origin ({origin}) is refused"
    return None


def host_refusal(name: str) -> str:
    """What a request whose ``Host`` header carries ``name`` (a name the server does
    not answer to) is told: how to allow it."""
    if not name:
        return "Invalid host header: the request names no host"
    shown = name if _PLAIN_NAME.fullmatch(name) else "NAME"
    return (
        f"Invalid host header: this dashboard does not answer to the name {shown!r}. "
        f"To reach it by that name, add --allow-host {shown} to the command that starts "
        f"it, keeping its other options: reactor ui [--host ADDRESS ...] --allow-host {shown}"
    )


class HostGuard(TrustedHostMiddleware):
    """Starlette's ``TrustedHostMiddleware``, whose refusal says how to allow a name.

    The name is read here only to explain a refusal: a request this check lets through
    still goes through Starlette's, which decides.
    """

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str]) -> None:
        super().__init__(app, allowed_hosts=allowed_hosts, www_redirect=False)
        self._logged: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.allow_any:
            name = _host_name(scope)
            if _is_own_address(name, scope):
                await self.app(scope, receive, send)
                return
            if not any(
                name == pattern or (pattern.startswith("*.") and name.endswith(pattern[1:]))
                for pattern in self.allowed_hosts
            ):
                message = host_refusal(name)
                if len(self._logged) < _LOGGED_MAX and name not in self._logged:
                    self._logged.add(name)
                    logger.warning("refused a request (400): %s", message)
                response = PlainTextResponse(
                    message, status_code=400, headers={"X-Content-Type-Options": "nosniff"}
                )
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _is_own_address(name: str, scope: Scope) -> bool:
    """Whether ``name`` is the address the request reached this server on, as when a
    server on 0.0.0.0 is opened by one of the machine's addresses. A page opened by
    its own IP address is no rebinding: that attack needs a name the attacker owns."""
    server = scope.get("server")
    return server is not None and name.strip("[]") == str(server[0]) and _is_address(name)


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def _host_name(scope: Scope) -> str:
    """The name in the request's ``Host`` header, without its port, in lower case."""
    host = ""
    for header, value in scope["headers"]:
        if header == b"host":
            host = value.decode("latin-1").strip().lower()
            break
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    name, colon, port = host.rpartition(":")
    return name if colon and port.isdigit() else host
