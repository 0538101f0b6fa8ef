"""A lean keep-alive HTTP/1.1 client for the proxies' hot path (gateway -> sidecar -> engine).

aiohttp's client costs ~270 µs of CPU per tiny request (URL objects, request/response objects, a
connector, timers, trace hooks); a proxy hop spends more on that than on its own work. This client
does only what a hop needs: write one request on a pooled connection, parse the answer with llhttp
(via ``httptools``), and hand the body over whole or chunk by chunk as it arrives (streams stay
unbuffered). Bodies are framed by Content-Length, chunked encoding (extensions and trailers read and
dropped) or connection close; llhttp refuses ambiguous framing. A server's ``Keep-Alive: timeout=N``
(nginx, Apache, our front) is honoured: a connection idle for N less :data:`KEEP_ALIVE_MARGIN_S` is
retired, not reused, so a server with a short idle limit does not close it under a request. A reused
connection the server closed while idle is detected before any response byte and the request re-sent
once on a new connection (only one idle for :data:`STALE_AFTER_IDLE_S`: sooner, the server had the
request); every other failure raises a :class:`ConnectionError` (``ConnectionRefusedError`` when
nothing listens, :class:`UpstreamClosed` when the server broke off mid-answer,
:class:`UpstreamTimeout` when it sent nothing for the read-idle limit). :func:`reached_upstream`
tells a failure before the request could reach the upstream (safe to send elsewhere) from one after
(it may have run it).

Upstream sockets have TCP keepalive on (:func:`set_keepalive`): a peer whose node died without
closing its connections is found in about a minute instead of never.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import NamedTuple, TypeVar

import httptools
from multidict import CIMultiDict

_T = TypeVar("_T")
_MAX_HEAD_BYTES = 64 * 1024
_PAUSE_BYTES = 1024 * 1024  # stop reading the socket while this much body waits for the consumer
_NO_BODY_STATUS = frozenset({204, 304})
# A silently dead peer (node lost, no RST) is found after idle + interval * count = 60 s of silence.
KEEPALIVE_IDLE_S = 30
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_COUNT = 3
READ_TIMEOUT_ENV = "PREFIXFLEET_UPSTREAM_READ_TIMEOUT_S"
# The longest an upstream may send nothing: before the head (a non-streamed answer's whole
# generation, a 100k-token prefill) or between chunks. Generous, as only a hung upstream (alive to
# TCP, so keepalive does not end it) should reach it; 0 in the variable turns the limit off.
DEFAULT_READ_TIMEOUT_S = 600.0
# A reused connection that closes before any answer byte is taken for one the server closed as idle
# (and re-sent once) only if it sat idle this long: no server a hop talks to closes a keep-alive
# connection sooner without saying so (uvicorn, under SGLang and vLLM: 5 s, no Keep-Alive header;
# aiohttp and the front: PREFIXFLEET_CLIENT_IDLE_TIMEOUT_S, 75 s by default, at least 1 s, advertised
# and honoured below). One idle for less was closed by a server that read the request: an engine
# that died of it, or broke off.
STALE_AFTER_IDLE_S = 2.0
# A server's Keep-Alive: timeout=N says it closes a connection idle for N s: one idle for N less this
# margin is retired, not reused (the front, aiohttp, nginx: a request written as the server closes is
# lost, and below STALE_AFTER_IDLE_S it is not re-sent). The margin covers the server's idle clock
# starting before ours (it ended the answer before we read it) and a busy loop noticing the close
# late; Node's http.Agent likewise subtracts a buffer from the hint. A hint of 1 s or less: no reuse.
KEEP_ALIVE_MARGIN_S = 1.0


class Origin(NamedTuple):
    host: str
    port: int
    tls: bool = False

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


class UpstreamClosed(ConnectionError):
    """The upstream closed the connection or sent something that is not HTTP/1.1 before the answer ended."""


class ConnectTimeout(ConnectionError, TimeoutError):
    """No connection within the connect limit: the upstream is as good as unreachable (retryable)."""


class UpstreamTimeout(ConnectionError, TimeoutError):
    """The upstream took the request and then sent nothing for the read-idle limit (it may be hung)."""


def reached_upstream(exc: BaseException) -> bool:
    """Whether an upstream failure came after the request may have reached the upstream: it broke off
    or went silent after the request was written (it may have run it, or died of it — re-sending it
    elsewhere could take the next replica down too), as opposed to a failure to connect at all
    (refused, DNS, connect timeout, TLS handshake: it never saw the request)."""
    return isinstance(exc, UpstreamClosed | UpstreamTimeout)


# X-Prefixfleet-Retryable's value on a sidecar's 502 when its engine failed after the request may
# have reached it ("1": it never did, safe to send anywhere): a gateway re-sends such a request at
# most its --resends-after-receipt times, so a prompt that crashes engines takes down few
RECEIVED_MARK = "received"
# The gateway's re-sends after a failure (``--max-retries``), and of those, re-sends of a request a
# worker may have received before failing: each may cost another engine if the prompt is what kills
# them (a query of death); one keeps a request alive through an unrelated engine crash.
DEFAULT_MAX_RETRIES = 3
DEFAULT_RESENDS_AFTER_RECEIPT = 1


def read_timeout_from_env(environ: Mapping[str, str] | None = None) -> float | None:
    """The read-idle limit from :data:`READ_TIMEOUT_ENV` (seconds; 0: none), else the default."""
    env = os.environ if environ is None else environ
    raw = env.get(READ_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_READ_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{READ_TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{READ_TIMEOUT_ENV}={raw!r} must be 0 (no limit) or a positive number of seconds")
    return value or None


def keep_alive_timeout(value: str) -> float | None:
    """The ``timeout`` parameter of a ``Keep-Alive`` header value, in seconds (``"timeout=5, max=100"``
    -> 5.0); None when it has none or a malformed one (then it is ignored, as HTTP clients do). The
    header counts whole seconds; a decimal is taken as sent rather than ignored."""
    for param in value.split(","):
        name, equals, number = param.partition("=")
        if equals and name.strip().lower() == "timeout":
            try:
                seconds = float(number.strip().strip('"'))
            except ValueError:
                return None
            return seconds if math.isfinite(seconds) and seconds >= 0 else None
    return None


def reuse_limit_s(pool_limit_s: float, hint_s: float | None) -> float:
    """How long a pooled connection may sit idle and still be reused: the pool's own limit, below a
    server's advertised idle limit (``hint_s``) by :data:`KEEP_ALIVE_MARGIN_S`; 0: not at all."""
    if hint_s is None:
        return pool_limit_s
    return max(0.0, min(pool_limit_s, hint_s - KEEP_ALIVE_MARGIN_S))


def set_keepalive(sock: socket.socket) -> None:
    """TCP keepalive with :data:`KEEPALIVE_IDLE_S`/``_INTERVAL_S``/``_COUNT`` where the platform has them."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPALIVE", KEEPALIVE_IDLE_S),  # macOS's name for the idle time
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, option, value)


class UpstreamResponse:
    """One response: status and headers once :meth:`Exchange.response` returned, then the body."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_conn",
        "_done",
        "_exc",
        "_waiter",
        "headers",
        "reason",
        "status",
    )

    def __init__(self, conn: _Connection, status: int, reason: str, headers: CIMultiDict[str]) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self._conn = conn
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._done = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    # -- fed by the connection -------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _PAUSE_BYTES:
            self._conn.pause()
        self._wake()

    def _finish(self, exc: BaseException | None = None) -> None:
        if self._done:
            return
        self._done = True
        self._exc = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = self._conn.loop.create_future()
        try:
            await self._conn.pool._within_read_timeout(self._waiter)
        finally:
            self._waiter = None

    # -- consumer side ---------------------------------------------------------------------------

    async def read(self) -> bytes:
        """The whole body (raises :class:`UpstreamClosed` if the connection broke before its end)."""
        while not self._done:
            self._conn.resume()  # the whole body is wanted: a body above the pause limit waits for nobody
            await self._wait()
        if self._exc is not None:
            raise self._exc
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        return data

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives: each step yields everything received since the previous one."""
        while True:
            if self._chunks:
                data = b"".join(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
                self._chunks.clear()
                self._buffered = 0
                self._conn.resume()
                yield data
            elif self._done:
                if self._exc is not None:
                    raise self._exc
                return
            else:
                await self._wait()

    @property
    def complete(self) -> bool:
        return self._done and self._exc is None


def _framed_by_close(headers: CIMultiDict[str]) -> bool:
    """Whether a body ends only when the connection does (RFC 9112 §6.3: no length, not chunked)."""
    encodings = ",".join(headers.getall("Transfer-Encoding", ()))
    if encodings:
        return encodings.rsplit(",", 1)[-1].strip().lower() != "chunked"
    return "Content-Length" not in headers


class _Connection(asyncio.Protocol):
    """One TCP connection and the llhttp parse of the response in flight on it.

    httptools calls the ``on_*`` methods while it parses; a new parser per request keeps no state
    from the previous answer. A body is handed to its response as llhttp yields it.
    """

    def __init__(self, pool: UpstreamPool, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False  # the last response ended cleanly on a keep-alive connection
        self.idle_since = 0.0  # time.monotonic() when its last answer ended (the server's idle clock)
        self.retire_at = 0.0  # pooled: reused only before this (time.monotonic(); UpstreamPool._release)
        self.hinted_s: float | None = None  # the server's Keep-Alive timeout, once an answer said it
        self._hint = ""  # that header's value as sent (the same on every answer: parsed once)
        self.served = 0  # responses completed on this connection
        self._paused = False
        self._parser: httptools.HttpResponseParser | None = None  # None: no request in flight
        self._head: asyncio.Future[UpstreamResponse] | None = None
        self._head_bytes = 0
        self._response: UpstreamResponse | None = None
        self._method = b""
        self._got_bytes = False
        self._keep_alive = True
        self._until_close = False  # the body ends with the connection
        self._reason = ""
        self._headers: CIMultiDict[str] = CIMultiDict()
        self._message_done = False  # the final answer ended (completed once the feed returns)
        self._error = ""  # why a callback stopped the parse

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        self._parser = None
        if self._response is not None:
            if self._until_close and exc is None:
                self._response._finish()
            else:
                self._response._finish(UpstreamClosed("connection closed before the response ended"))
            self._response = None
        if self._head is not None and not self._head.done():
            self._head.set_exception(UpstreamClosed("connection closed before the response head"))

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        parser = self._parser
        if parser is None:
            self.abort()  # bytes nobody asked for: the connection is out of sync
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if self._error:
                self._fail(self._error)
                return
            if not self._message_done:
                self._fail(f"malformed response: {exc}")
                return
        except httptools.HttpParserUpgrade:
            self._fail("the upstream switched protocols")
            return
        except httptools.HttpParserError as exc:
            self._fail(f"malformed response: {exc}")
            return
        if self._message_done:
            self._complete()
        elif self._head is not None:
            self._head_bytes += len(data)
            if self._head_bytes > _MAX_HEAD_BYTES:
                self._fail("response head too large")

    def eof_received(self) -> bool | None:
        return False  # close the transport: connection_lost finishes or fails the response

    def pause(self) -> None:
        if not self._paused and self.transport is not None and not self.closed:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    def abort(self) -> None:
        self.closed = True
        self.reusable = False
        self._parser = None
        if self.transport is not None:
            self.transport.abort()

    # -- llhttp callbacks ------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._message_done:
            self._error = "bytes after the end of the response"
            raise UpstreamClosed(self._error)
        self._reason = ""
        self._headers = CIMultiDict()

    def on_status(self, reason: bytes) -> None:
        self._reason += reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._response is None:  # after the head these are trailers, which a hop drops
            self._headers.add(name.decode("latin-1"), value.decode("latin-1").strip(" \t"))

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None
        if not parser.get_http_version().startswith("1."):
            self._error = f"not an HTTP/1.x response (HTTP/{parser.get_http_version()})"
            raise UpstreamClosed(self._error)
        status = parser.get_status_code()
        if not 100 <= status <= 599:  # llhttp takes any 3 digits; RFC 9110 §15 defines 1xx..5xx only
            self._error = f"invalid status {status} (HTTP status codes are 100..599)"
            raise UpstreamClosed(self._error)
        if status < 200:
            return  # an interim answer (100 Continue): llhttp goes on to the real head
        headless = self._method == b"HEAD"
        self._keep_alive = parser.should_keep_alive()  # only valid before the message ends
        hint = self._headers.get("Keep-Alive")
        if hint is not None and hint != self._hint:
            self._hint = hint
            self.hinted_s = keep_alive_timeout(hint)
        self._until_close = not headless and status not in _NO_BODY_STATUS and _framed_by_close(self._headers)
        response = UpstreamResponse(self, status, self._reason, self._headers)
        self._response = response
        head, self._head = self._head, None
        if head is not None and not head.done():
            head.set_result(response)
        if headless:
            # llhttp cannot be told a HEAD answer has no body: stop it here, the answer is complete.
            self._message_done = True
            raise _HeadAnswered

    def on_body(self, body: bytes) -> None:
        if self._response is not None:
            self._response._feed(body)

    def on_message_complete(self) -> None:
        if self._response is not None:  # else an interim answer ended
            self._message_done = True

    # -- one exchange ----------------------------------------------------------------------------

    def send(self, method: bytes, request: bytes) -> asyncio.Future[UpstreamResponse]:
        assert self.transport is not None
        self.reusable = False
        self._method = method
        self._got_bytes = False
        self._head_bytes = 0
        self._message_done = False
        self._error = ""
        self._until_close = False
        self._parser = httptools.HttpResponseParser(self)
        self._head = self.loop.create_future()
        self.transport.write(request)
        return self._head

    def _fail(self, message: str) -> None:
        error = UpstreamClosed(message)
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        if self._response is not None:
            self._response._finish(error)
            self._response = None
        self.abort()

    def _complete(self) -> None:
        response, self._response = self._response, None
        self._parser = None
        self.served += 1
        self.reusable = self._keep_alive and not self.closed
        if self.reusable:
            # the server's idle clock starts at its answer's end, not when the hop that relays the
            # answer gives the connection back (a slow client can hold that up for seconds)
            self.idle_since = time.monotonic()
        if response is not None:
            response._finish()


class _HeadAnswered(Exception):
    """Raised from a callback to stop llhttp after the head of an answer to HEAD."""


class Exchange:
    """A request written to an upstream; :meth:`response` waits for its head."""

    __slots__ = ("_conn", "_head", "_maybe_stale", "_method", "_origin", "_pool", "_request", "_response")

    def __init__(self, pool: UpstreamPool, origin: Origin, method: bytes, request: bytes) -> None:
        self._pool = pool
        self._origin = origin
        self._method = method
        self._request = request
        self._conn: _Connection | None = None
        self._head: asyncio.Future[UpstreamResponse] | None = None
        self._maybe_stale = False  # a reused connection the server may have closed as idle
        self._response: UpstreamResponse | None = None

    async def _send(self) -> None:
        self._conn, idle_s = await self._pool._acquire(self._origin)
        self._maybe_stale = idle_s >= STALE_AFTER_IDLE_S
        self._head = self._conn.send(self._method, self._request)

    async def response(self) -> UpstreamResponse:
        assert self._head is not None and self._conn is not None
        pool = self._pool
        try:
            self._response = await pool._within_read_timeout(self._head)
        except UpstreamClosed as closed:
            if not self._maybe_stale or self._conn._got_bytes:
                # A fresh connection, or one idle too briefly for an idle close: the server had the
                # request (sending it again would hit the same engine twice with a query of death).
                raise
            # The server closed this idle keep-alive connection as we reused it: it never saw the
            # request, so sending it once more on a fresh connection is safe.
            self._conn.abort()
            try:
                self._conn = await pool._connect(self._origin)
            except OSError as exc:
                # The first write may have reached a server that then died (of it, maybe): not a
                # failure before the request could arrive, whatever the reconnect's error says.
                raise UpstreamClosed(f"{closed}; reconnecting failed: {exc.__class__.__name__}") from exc
            self._maybe_stale = False
            self._head = self._conn.send(self._method, self._request)
            self._response = await pool._within_read_timeout(self._head)
        return self._response

    def close(self) -> None:
        """Give the connection back if its response ended cleanly, otherwise abort it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        response = self._response
        if response is not None and response.complete and conn.reusable:
            response._chunks.clear()
            self._pool._release(conn)
        else:
            conn.abort()

    async def __aenter__(self) -> Exchange:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.close()


class UpstreamPool:
    """Keep-alive connections per (host, port); owned by one proxy app, closed with it."""

    def __init__(
        self,
        *,
        connect_timeout_s: float = 3.0,
        idle_timeout_s: float = 15.0,
        max_idle: int = 256,
        read_timeout_s: float | None = DEFAULT_READ_TIMEOUT_S,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s  # the longest silence once a request is sent (None: none)
        # below the servers' own keep-alive limit (uvicorn 5 s, aiohttp 75 s); lower still for a server
        # whose Keep-Alive header says its limit is shorter (reuse_limit_s)
        self.idle_timeout_s = idle_timeout_s
        self.max_idle = max_idle
        self._idle: dict[Origin, list[_Connection]] = {}
        self._closed = False
        self._ssl: ssl.SSLContext | None = None

    async def send(
        self,
        origin: Origin,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes | None,
    ) -> Exchange:
        """Write the request (on an idle connection when there is one, without suspending)."""
        lines = [f"{method} {target} HTTP/1.1\r\nHost: {origin.authority}\r\n"]
        for name, value in headers:
            lines.append(f"{name}: {value}\r\n")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body) if body else 0}\r\n")
        lines.append("\r\n")
        # aiohttp keeps header bytes that are not UTF-8 (latin-1 text, say) as surrogate escapes:
        # this sends the client's original bytes on
        head = "".join(lines).encode("utf-8", "surrogateescape")
        exchange = Exchange(self, origin, method.encode("ascii"), head + body if body else head)
        await exchange._send()
        return exchange

    async def _within_read_timeout(self, waiter: asyncio.Future[_T]) -> _T:
        """``waiter``'s result, or :class:`UpstreamTimeout` when nothing arrived within the limit.

        A bare timer that fails ``waiter`` itself, not ``asyncio.timeout``: that one builds a context
        manager, looks the task up and cancels it to time out, ~9 µs per wait where this costs ~1 µs,
        and every exchange waits twice (its head, its body) on both hops."""
        limit = self.read_timeout_s
        if limit is None:
            return await waiter
        timer = waiter.get_loop().call_later(limit, _time_out, waiter, limit)
        try:
            return await waiter
        finally:
            timer.cancel()

    async def _acquire(self, origin: Origin) -> tuple[_Connection, float]:
        """A connection to ``origin`` and how long it sat idle (0: a new one)."""
        idle = self._idle.get(origin)
        if idle:
            now = time.monotonic()
            while idle:
                conn = idle.pop()
                if not conn.closed and now <= conn.retire_at:
                    return conn, now - conn.idle_since
                conn.abort()
        return await self._connect(origin), 0.0

    async def _connect(self, origin: Origin) -> _Connection:
        if self._closed:
            raise ConnectionError("the upstream pool is closed")
        loop = asyncio.get_running_loop()
        tls: dict[str, object] = {}
        if origin.tls:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            tls = {"ssl": self._ssl, "server_hostname": origin.host}
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                transport, conn = await loop.create_connection(
                    lambda: _Connection(self, origin), origin.host, origin.port, **tls
                )
        except TimeoutError as exc:
            if isinstance(exc, ConnectionError):
                raise
            raise ConnectTimeout(
                f"no connection to {origin.authority} within {self.connect_timeout_s:g} s"
            ) from None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            set_keepalive(sock)
        return conn

    def _release(self, conn: _Connection) -> None:
        idle = self._idle.setdefault(conn.origin, [])
        limit = reuse_limit_s(self.idle_timeout_s, conn.hinted_s)
        if self._closed or len(idle) >= self.max_idle or limit <= 0:
            conn.abort()  # limit 0: the server closes idle connections too soon to reuse one safely
            return
        conn.retire_at = conn.idle_since + limit  # idle since its last answer ended (_complete)
        idle.append(conn)

    def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                with contextlib.suppress(Exception):
                    conn.abort()
        self._idle.clear()


def _time_out(waiter: asyncio.Future[object], limit: float) -> None:
    """Fail a wait the upstream left unanswered for ``limit`` seconds (see ``_within_read_timeout``)."""
    if not waiter.done():
        waiter.set_exception(UpstreamTimeout(f"the upstream sent nothing for {limit:g} s"))
        # marked retrieved: a task cancelled just as this fired never awaits it (no "never retrieved" log)
        waiter.exception()


def split_url(url: str) -> tuple[Origin, str]:
    """``http[s]://host[:port][/prefix]`` -> (its origin, the path prefix without a trailing slash)."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        raise ValueError(f"upstream URL {url!r} must start with http:// or https://")
    hostport, slash, path = rest.partition("/")
    if hostport.startswith("["):
        host, _, port = hostport[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = hostport.partition(":")
    if not host:
        raise ValueError(f"upstream URL {url!r} has no host")
    try:
        number = int(port) if port else (443 if scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"upstream URL {url!r} has a malformed port") from None
    prefix = (slash + path).rstrip("/")
    return Origin(host, number, scheme == "https"), prefix
