"""Time limits on slow HTTP clients, shared by the gateway, the sidecar and the emulator.

A client that opens a connection and sends nothing, or half its headers, is closed after the idle
limit (aiohttp's keep-alive timer, which also runs before the first request); every answer that
keeps its connection says that limit in a ``Keep-Alive: timeout=N`` header, so a client that honours
it (the hops' :class:`~.upstream.UpstreamPool`) stops reusing an idle connection before it is
closed. A client that sends its headers and then trickles or stalls its body would hold a handler
(and the body buffer) forever: :func:`body_deadline` reads every request body within the body limit
first and answers 408 otherwise, closing the connection. A client that stops reading a streamed
answer but keeps its connection open would hold the engine's work (and its KV cache) for as long as
it likes: a write that cannot complete within the write limit ends the stream, closes the connection
and aborts the request upstream, as when the client leaves (the proxies apply it; the gateway and
sidecar also take it as ``--client-write-timeout``). The limits come from the environment so every
service and every deployment (chart, operator pods, local fleet) can tune them without new flags.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from aiohttp import web

from .content_coding import names_no_coding, read_body

BODY_TIMEOUT_ENV = "PREFIXFLEET_CLIENT_BODY_TIMEOUT_S"
IDLE_TIMEOUT_ENV = "PREFIXFLEET_CLIENT_IDLE_TIMEOUT_S"
WRITE_TIMEOUT_ENV = "PREFIXFLEET_CLIENT_WRITE_TIMEOUT_S"
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_IDLE_TIMEOUT_S = 75.0
# The shortest idle limit PREFIXFLEET_CLIENT_IDLE_TIMEOUT_S takes. The limit is advertised to clients
# in whole seconds (``Keep-Alive: timeout=N``, as nginx and Apache send it): below 1 s that says 0, so
# no client could keep a connection at all, and the same limit also closes a connection whose
# client has not finished its head, which a sub-second limit does to ordinary clients on a busy node.
# A value that short is a mistake (milliseconds meant?): refused at start-up, naming the variable.
MIN_IDLE_TIMEOUT_S = 1.0
# nginx's send_timeout: a client that accepts no byte for a minute is gone (its socket buffers hold
# hundreds of streamed tokens, so a slow reader never waits this long)
DEFAULT_WRITE_TIMEOUT_S = 60.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Responder = Callable[[web.Request, int, str], web.StreamResponse]


@dataclass(frozen=True, slots=True)
class ClientTimeouts:
    body_s: float = DEFAULT_BODY_TIMEOUT_S  # the whole request body must arrive within this
    idle_s: float = DEFAULT_IDLE_TIMEOUT_S  # idle keep-alive connection / incomplete headers
    write_s: float = DEFAULT_WRITE_TIMEOUT_S  # a stream's write waiting on a client that reads nothing

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, write_s: float | None = None
    ) -> ClientTimeouts:
        """The limits from the environment; ``write_s`` (a flag's value) overrides its variable."""
        env = os.environ if environ is None else environ
        if write_s is None:
            write_s = _positive(env, WRITE_TIMEOUT_ENV, DEFAULT_WRITE_TIMEOUT_S)
        return cls(
            body_s=_positive(env, BODY_TIMEOUT_ENV, DEFAULT_BODY_TIMEOUT_S),
            idle_s=_positive(
                env, IDLE_TIMEOUT_ENV, DEFAULT_IDLE_TIMEOUT_S, at_least=(MIN_IDLE_TIMEOUT_S, _IDLE_FLOOR_WHY)
            ),
            write_s=write_s,
        )

    @property
    def keep_alive(self) -> str:
        """The ``Keep-Alive`` header's value on an answer that keeps its connection: the idle limit in
        whole seconds, rounded down (a client that honours it retires the connection before this
        server closes it, rather than send a request on a connection being closed)."""
        return f"timeout={math.floor(self.idle_s)}"

    def runner_kwargs(self) -> dict[str, float]:
        """Keyword arguments for ``web.AppRunner``: close idle and header-stalled connections, and
        after an early answer (408, 413) drain the unread body for at most 2 s, not aiohttp's 10."""
        return {"keepalive_timeout": self.idle_s, "lingering_time": min(2.0, self.body_s)}


_IDLE_FLOOR_WHY = (
    "a shorter limit would close connections of clients still sending their request, and the"
    " Keep-Alive header advertising it counts whole seconds"
)


def _positive(
    env: Mapping[str, str], name: str, default: float, *, at_least: tuple[float, str] | None = None
) -> float:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {raw!r}")
    if at_least is not None and value < at_least[0]:
        raise ValueError(f"{name} must be at least {at_least[0]:g} s ({at_least[1]}), got {raw!r}")
    return value


def body_deadline(
    timeouts: ClientTimeouts, respond: Responder
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Middleware: read the body within ``timeouts.body_s`` (408) and within the app's
    ``client_max_size`` (413; at once, before reading, when its declared length is above it:
    :func:`declared_too_large`); ``respond(request, status, message)`` shapes the error answer.
    Handlers then get the buffered body from ``request.read()`` at no cost."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.body_exists:
            codings = request.headers.getall("Content-Encoding", [])
            if declared_too_large(request.content_length, request.client_max_size, codings):
                return too_large(request, respond)
            try:
                if request.content.is_eof():
                    await read_body(request)  # already all here (the usual small body): no timer to arm
                else:
                    async with asyncio.timeout(timeouts.body_s):
                        await read_body(request)
            except TimeoutError:
                response = respond(request, 408, f"request body not received within {timeouts.body_s:g} s")
                response.force_close()
                return response
            except web.HTTPRequestEntityTooLarge:
                return too_large(request, respond)
        return await handler(request)

    return middleware


def declared_too_large(declared_length: int | None, limit: int, codings: Sequence[str]) -> bool:
    """Whether a body is above ``limit`` (the app's ``client_max_size``, 0 for none) by its
    Content-Length alone, so it can be refused before a byte of it is read. Only a body sent as is
    (no Content-Encoding, or ``identity``): the limit counts decoded bytes, and a gzip body's length
    says little about its decoded size (incompressible data grows a little when compressed)."""
    too_long = limit > 0 and declared_length is not None and declared_length > limit
    return too_long and names_no_coding(codings)


def too_large(request: web.Request, respond: Responder) -> web.StreamResponse:
    """The 413 for a body above the app's ``client_max_size``, closing the connection after it."""
    response = respond(request, 413, f"request body exceeds {request.client_max_size} bytes")
    response.force_close()  # the rest of the body is not read here (drain_refused_bodies may)
    return response
