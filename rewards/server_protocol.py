"""uvicorn's HTTP/1.1 protocol with what it lacks against slow or idle clients.

uvicorn (0.55) has no deadline for a request's headers: a connection that sends nothing, or half a
header line, stays open for ever, and any byte it sends cancels the keep-alive timer. Left alone, enough
such connections use up the process's file descriptors and ``/health`` stops answering. Here:

- every connection has ``header_timeout_s`` to send each request's headers (from when it opened, or
  from the end of its previous answer); after that it is closed;
- at most ``max_connections`` are open; a new one over the cap closes the oldest connection still
  waiting for its headers, or, when every open connection is busy with a request, is itself closed.

Bodies have their own deadline (``body_timeout_s``), kept by the app as it reads them.
"""

from __future__ import annotations

import asyncio
import resource
import warnings
from collections import OrderedDict
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from rewards.server_limits import Limits


class GuardedH11Protocol(H11Protocol):
    """:class:`H11Protocol` with a header deadline and a connection cap (see the module); the limits and
    the queue of connections waiting for headers belong to the subclass :func:`guarded_protocol` makes."""

    limits: Limits = Limits()
    #: connections waiting for a request's headers, oldest first
    awaiting_headers: OrderedDict[GuardedH11Protocol, None] = OrderedDict()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.header_deadline: asyncio.TimerHandle | None = None
        self.await_headers()
        if len(self.connections) > self.limits.max_connections:
            oldest = next((other for other in self.awaiting_headers if other is not self), self)
            oldest.drop()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self.headers_arrived()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.await_headers()  # keep-alive: the next request has its own deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self.headers_arrived()
        super().connection_lost(exc)

    def await_headers(self) -> None:
        self.headers_arrived()
        self.awaiting_headers[self] = None
        self.header_deadline = self.loop.call_later(self.limits.header_timeout_s, self.drop)

    def headers_arrived(self) -> None:
        self.awaiting_headers.pop(self, None)
        if self.header_deadline is not None:
            self.header_deadline.cancel()
            self.header_deadline = None

    def drop(self) -> None:
        """Close the connection without an answer (it has not sent a request to answer)."""
        self.headers_arrived()
        if not self.transport.is_closing():
            self.transport.close()


def guarded_protocol(limits: Limits) -> type[GuardedH11Protocol]:
    """A protocol class for one server: its own ``limits`` and its own queue of connections."""
    return type(
        "GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits, "awaiting_headers": OrderedDict()}
    )


def server_config(app: Any, limits: Limits, **options: Any) -> uvicorn.Config:
    """A ``uvicorn.Config`` serving ``app`` with the guarded protocol; ``options`` go to ``uvicorn.Config``."""
    return uvicorn.Config(app, http=guarded_protocol(limits), **options)


def raise_open_file_limit(connections: int) -> None:
    """Lift the soft limit on open files to what ``connections`` need (plus 256 for the rest), up to the
    hard limit; warn if the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        ceiling = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
        if ceiling < wanted:
            warnings.warn(
                f"open-file limit {hard} is below max_connections={connections} + 256; "
                "lower --max-connections or raise the hard limit (ulimit -Hn)",
                stacklevel=2,
            )
