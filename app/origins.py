"""Which sites may call the demo: a check on every request's ``Host`` and ``Origin`` headers.

Gradio withholds its CORS headers from other origins, so a browser does not show another site the
answers, but the request itself is still run (a generation queued from any page the user visits), and a
DNS-rebinding page, whose requests carry its own name as ``Host`` and ``Origin``, passes Gradio's check.
Here a request is refused (403, before Gradio sees it) unless:

- its ``Host`` is an IP address (a page cannot rebind those), ``localhost``, or a name given with
  ``--allowed-host``; and
- its ``Origin``, when it has one (browsers send it on every POST and cross-origin request), is the same
  host as its ``Host`` (the demo's own page), or an allowed name.

Behind a reverse proxy, or with Gradio's share link, the public name must be allowed with
``--allowed-host NAME``; ``--allowed-host '*'`` allows any ``Host`` (the ``Origin`` must still match it).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send


def hostname(value: str, with_scheme: bool) -> str | None:
    """The lower-case host name of a ``Host`` value (``name[:port]``) or an ``Origin`` (``scheme://name``)."""
    try:
        return urlsplit(value if with_scheme else f"//{value}").hostname
    except ValueError:
        return None


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class AllowedOrigins:
    """ASGI middleware: 403 for an HTTP or WebSocket request whose ``Host`` or ``Origin`` is not allowed."""

    def __init__(self, app: ASGIApp, hosts: Iterable[str] = ()) -> None:
        self.app = app
        self.names = {"localhost"} | {host.lower().strip("[]") for host in hosts}

    def allows(self, headers: dict[bytes, bytes]) -> bool:
        host = hostname(headers.get(b"host", b"").decode("latin-1"), with_scheme=False)
        if host is None or not (is_address(host) or host in self.names or "*" in self.names):
            return False
        origin = headers.get(b"origin")
        if origin is None:
            return True
        origin_host = hostname(origin.decode("latin-1"), with_scheme=True)
        return origin_host == host or origin_host in self.names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and not self.allows(dict(scope["headers"])):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            refusal = PlainTextResponse(
                "This demo answers only pages it serves itself (start it with --allowed-host NAME to allow "
                "another host name).",
                status_code=403,
            )
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)
