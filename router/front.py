"""A lean HTTP/1.1 front for the proxies' generation endpoints; every other request goes to aiohttp.

aiohttp's server spends ~230 µs of CPU on a tiny request (request and response objects, routing,
middleware, timers); for a proxy hop that is most of the cost. This front serves well-formed ``POST``
requests to the hot paths itself (HTTP/1.1, a Content-Length body, no Expect, no Transfer-Encoding,
no Content-Encoding)
and runs their handler with a :class:`HotRequest`. Parsing is llhttp's (via ``httptools``), which
refuses what could be misread (Content-Length with Transfer-Encoding, duplicate lengths, obs-fold,
bare LF, invalid bytes). The front keeps a request's raw bytes until its head is parsed; a request
that is anything else (another path or method, a head llhttp refuses, an oversized head or body,
HTTP/1.0) hands the whole connection to aiohttp's own protocol with the bytes received so far, so
aiohttp answers it exactly as it would have (errors, 413, admin endpoints); that connection stays
with aiohttp.

Slow clients are bounded as under aiohttp: a connection idle (or sending a head) longer than the idle
limit is closed; a body not complete within the body limit gets the app's 408 answer. Every answer
that keeps its connection (here and from aiohttp behind) advertises the idle limit as
``Keep-Alive: timeout=N``, so the hop in front retires a pooled connection before it is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from types import EllipsisType
from typing import Any, TypeVar

import httptools
from aiohttp import http_exceptions, web
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict

from .content_coding import NO_CODING, coding_in_parser_error, unsupported_answer, unsupported_message
from .slow_clients import ClientTimeouts

log = logging.getLogger("prefixfleet.front")

_MAX_HEAD_BYTES = 8190  # aiohttp's own line limit: a longer head is aiohttp's to refuse
# an idle timer firing this close to its limit closes (uvloop's timers have a 1 ms resolution)
_TIMER_SLACK_S = 0.001
_PIPELINE_PAUSE_BYTES = 256 * 1024  # stop reading while a handler runs and this much is queued
_FRAMING = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive"})
_NO_BODY_STATUS = frozenset({204, 304})
_HANDED_OVER_HEADERS = frozenset({"transfer-encoding", "expect", "upgrade"})
# aiohttp>=3.9 is allowed; BadHttpMethod came with 3.11.8 (older: TLS and other noise logs at INFO)
_BAD_METHOD: type[Exception] | tuple[()] = getattr(http_exceptions, "BadHttpMethod", ())
_BAD_URL: type[Exception] | tuple[()] = getattr(http_exceptions, "InvalidURLError", ())
# tcp_info's layout below is Linux's
_TCP_INFO: int | None = getattr(socket, "TCP_INFO", None) if sys.platform == "linux" else None
# a handler's bug, in the OpenAI error shape of every other answer
_INTERNAL_ERROR = {"error": {"message": "internal error", "type": "server_error", "param": None, "code": 500}}

HotHandler = Callable[["HotRequest"], Awaitable[web.StreamResponse | Any]]
Responder = Callable[[Any, int, str], web.StreamResponse]
# Headers for an answer aiohttp's protocol gives before the app sees the request (a head its parser
# refuses, a coding it cannot decode), and for the front's own 500 (a HotRequest): the gateway names
# the request (X-Request-Id), as every answer
RefusalHeaders = Callable[[Any], Mapping[str, str]]


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class _DateHeader:
    """The Date header, formatted once per second."""

    def __init__(self) -> None:
        self._second = -1
        self._line = b""

    def line(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._line = b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return self._line


class ClientStalled(Exception):
    """A streamed answer's write waited longer than the write limit on a client that reads nothing;
    its connection is closed (the handler then leaves, which aborts the request upstream)."""


class StallWatch:
    """The write limit of one wait on a client's socket: ``on_stall`` runs once the client took no
    byte for ``limit_s``. Checked every ``limit_s``: a client that took bytes since the last check (a
    slow reader, still reading) gets another period, as nginx's send_timeout counts between two
    successful sends, not over the whole wait. Taking is read from TCP's acknowledged byte count: the
    kernel's send buffer (megabytes, autotuned) lets the transport write again only once about a
    third of it drained, which a slow reader takes minutes to do."""

    __slots__ = ("_handle", "_limit_s", "_loop", "_on_stall", "_taken", "_transport")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        transport: asyncio.Transport,
        limit_s: float,
        on_stall: Callable[[], object],
    ) -> None:
        self._loop = loop
        self._transport = transport
        self._limit_s = limit_s
        self._on_stall = on_stall
        self._taken = bytes_taken(transport)
        self._handle = loop.call_later(limit_s, self._check)

    def _check(self) -> None:
        taken = bytes_taken(self._transport)
        if taken > self._taken:
            self._taken = taken
            self._handle = self._loop.call_later(self._limit_s, self._check)
        else:
            self._on_stall()

    def cancel(self) -> None:
        self._handle.cancel()


_TCP_INFO_BYTES_ACKED = slice(120, 128)  # struct tcp_info's tcpi_bytes_acked (Linux 4.1+), a u64


def bytes_taken(transport: asyncio.Transport) -> int:
    """A count that grows as the client takes bytes of what was written to it: TCP's acknowledged
    bytes where the kernel tells (Linux), else minus the transport's unsent bytes."""
    sock = transport.get_extra_info("socket")
    if sock is not None and _TCP_INFO is not None:
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 128)
        except OSError:  # not TCP (a Unix socket)
            info = b""
        if len(info) == 128:
            return int.from_bytes(info[_TCP_INFO_BYTES_ACKED], sys.byteorder)
    return -transport.get_write_buffer_size()


class HotStream:
    """A streamed (chunked) answer to a :class:`HotRequest`: ``write`` chunks, then ``write_eof``."""

    def __init__(self, conn: _FrontConnection, status: int) -> None:
        self.status = status
        self._conn = conn
        self._ended = False

    async def write(self, data: bytes) -> None:
        if not data:
            return
        conn = self._conn
        if conn.closed:
            raise ConnectionResetError("the client closed the connection")
        conn.transport.write(b"%x\r\n%s\r\n" % (len(data), data))
        if conn.write_paused:
            await conn.drain()

    async def write_eof(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self._conn.closed:
            raise ConnectionResetError("the client closed the connection")
        self._conn.transport.write(b"0\r\n\r\n")


class HotRequest:
    """What the generation handlers read of a request (the subset of ``web.Request`` they use)."""

    __slots__ = (
        "_body",
        "_conn",
        "headers",
        "method",
        "path",
        "raw_path",
        "request_id",
        "response",
        "sent",
        "version",
    )

    def __init__(
        self, conn: _FrontConnection, method: str, raw_path: str, headers: CIMultiDict[str], body: bytes
    ) -> None:
        self._conn = conn
        self.method = method
        self.raw_path = raw_path
        self.path = raw_path.split("?", 1)[0]
        self.headers = headers
        self._body = body
        self.version = (1, 1)
        self.sent = False  # an answer (whole or the head of a stream) went out
        self.response: HotStream | None = None
        # the server's id for it, once asked (the gateway's: its 500 then names the one already used)
        self.request_id: str | None = None

    @property
    def path_qs(self) -> str:
        return self.raw_path

    @property
    def remote(self) -> str | None:
        """The client's address, as ``web.Request.remote`` (the gateway's X-Forwarded-For)."""
        return self._conn.peer_host()

    async def read(self) -> bytes:
        return self._body

    def start_stream(self, status: int, headers: Mapping[str, str]) -> HotStream:
        conn = self._conn
        if conn.closed:
            raise ConnectionResetError("the client closed the connection")
        self.sent = True
        head = [b"HTTP/1.1 %d %s\r\n" % (status, _reason(status).encode())]
        head.extend(_header_lines(headers))
        head.append(b"Transfer-Encoding: chunked\r\n")
        if not conn.close_after:
            head.append(conn.front.keep_alive_line)
        if "Date" not in headers:  # a proxied answer keeps its origin's Date (a single-valued field)
            head.append(conn.front.date.line())
        head.append(b"\r\n")
        conn.transport.write(b"".join(head))
        self.response = HotStream(conn, status)
        return self.response

    def send_response(self, response: web.Response) -> None:
        """Write a whole ``web.Response`` now (its handler may keep working afterwards)."""
        if self.sent:
            return
        self.sent = True
        conn = self._conn
        if conn.closed:
            return
        body = response.body
        if body is None:
            data = b""
        elif isinstance(body, bytes | bytearray | memoryview):
            data = bytes(body)
        else:  # a payload object (not produced by the proxies): aiohttp would stream it
            data = bytes(getattr(body, "_value", b""))
        head = [
            b"HTTP/1.1 %d %s\r\n" % (response.status, (response.reason or _reason(response.status)).encode())
        ]
        head.extend(_header_lines(response.headers))
        if response.status in _NO_BODY_STATUS or response.status < 200:
            data = b""  # these answers carry no body and no Content-Length (RFC 9110)
        else:
            if data and "Content-Type" not in response.headers:
                head.append(b"Content-Type: application/octet-stream\r\n")  # as aiohttp would
            head.append(b"Content-Length: %d\r\n" % len(data))
        if "Date" not in response.headers:  # a proxied answer keeps its origin's Date
            head.append(conn.front.date.line())
        if response.keep_alive is False:
            conn.close_after = True
        head.append(b"Connection: close\r\n" if conn.close_after else conn.front.keep_alive_line)
        head.append(b"\r\n")
        conn.transport.write(b"".join(head) + data)


def head_end(buffer: bytes, start: int, limit: int = _MAX_HEAD_BYTES) -> tuple[int, int]:
    """Where the head at the start of ``buffer`` ends (the index of its CRLF blank line; -1 if none
    within ``limit`` bytes yet) and where the next search of the grown buffer starts: only the new
    bytes and the 3 before them, which a terminator may straddle (a head sent byte by byte was
    rescanned from its start for every byte). ``start``: the previous search's answer, 0 at first."""
    end = buffer.find(b"\r\n\r\n", start, limit + 4)
    if end >= 0:
        return end, 0
    return -1, max(start, min(len(buffer), limit + 4) - 3)


def _header_lines(headers: Mapping[str, str]) -> list[bytes]:
    return [
        f"{name}: {value}\r\n".encode()
        for name, value in headers.items()
        if name.lower() not in _FRAMING and "\n" not in value and "\r" not in value
    ]


class _NotHot(Exception):
    """Raised from a parser callback: this request is aiohttp's to answer."""


class _RequestParse:
    """What llhttp reports of one request; httptools calls the ``on_*`` methods while it parses."""

    __slots__ = (
        "body",
        "complete",
        "head_complete",
        "headers",
        "keep_alive",
        "length",
        "parser",
        "size",
        "target",
        "url",
    )

    def __init__(self) -> None:
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self.url = b""
        self.target = ""
        self.headers: CIMultiDict[str] = CIMultiDict()
        self.length = -1  # Content-Length; -1: none
        self.head_complete = False
        self.keep_alive = True
        self.size = 0  # bytes of the head, up to and including the blank line
        self.body: list[bytes] = []
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("ascii")  # llhttp lets only token characters into a name
        text = value.decode("ascii").strip(" \t")  # non-ASCII: aiohttp decides how to read it
        lower = key.lower()
        if lower == "content-length":
            self.length = int(text)  # llhttp accepted it: digits only, and only one
        elif lower in _HANDED_OVER_HEADERS or (lower == "connection" and "upgrade" in text.lower()):
            raise _NotHot
        elif lower == "content-encoding" and text.lower() not in NO_CODING:
            raise _NotHot  # aiohttp decodes the body or refuses its coding (.content_coding)
        self.headers.add(key, text)

    def on_headers_complete(self) -> None:
        self.head_complete = True
        if self.parser is not None:
            self.keep_alive = self.parser.should_keep_alive()  # only valid before the message ends

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    def release(self) -> None:
        """Drop the parser: it holds these bound methods, a cycle only the GC would otherwise free."""
        self.parser = None


class _FrontConnection(asyncio.Protocol):
    def __init__(self, front: HotFront) -> None:
        self.front = front
        self.loop = front.loop
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.closed = False
        self.close_after = False
        self.write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._buffer = b""
        self._busy = False
        self._read_paused = False
        self._timer: asyncio.TimerHandle | None = None
        self._body_wait = False  # the timer is the body deadline (else the idle/head limit)
        self._idle_from = 0.0  # loop time the idle limit counts from (see _arm_idle)
        # the request at the front of the buffer, once its head is parsed
        self._head: _RequestParse | None = None
        # llhttp fed a head's bytes while its CRLF blank line has not come (see _refused_so_far)
        self._probe: _RequestParse | None = None
        self._probed = 0  # bytes of the buffer fed to the probe
        self._scanned = 0  # where the search for the head's end resumes (see head_end)
        self._running: tuple[HotRequest, asyncio.Task[None]] | None = None  # the request being handled
        self._peer: str | EllipsisType | None = ...  # the client's address, once asked (...: not yet)

    def peer_host(self) -> str | None:
        """The client's address (None if unknown), read once per connection: every request on it
        comes from the same peer."""
        host = self._peer
        if host is ...:
            peer = self.transport.get_extra_info("peername") if self.transport else None
            host = self._peer = str(peer[0]) if isinstance(peer, tuple | list) and peer else None
        return host

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.front.connections.add(self)
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.front.connections.discard(self)
        self._cancel_timer()
        running = self._running
        if running is not None and not running[0].sent:
            # The client left before its answer began: stop waiting upstream, which aborts the
            # request there too (a stream already begun ends at its next write instead).
            running[1].cancel()
        if self._head is not None:
            self._head.release()
        self._drop_probe()
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ConnectionResetError("the client closed the connection"))

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    async def drain(self) -> None:
        if not self.write_paused:
            return
        # the timer is armed only here: a client that keeps reading never pays for it
        waiter = self._drain
        if waiter is None or waiter.done():
            waiter = self._drain = self.loop.create_future()
        watch = StallWatch(
            self.loop, self.transport, self.front.timeouts.write_s, lambda: self._write_stalled(waiter)
        )
        try:
            await waiter
        finally:
            watch.cancel()

    def _write_stalled(self, waiter: asyncio.Future[None]) -> None:
        if waiter.done():
            return
        limit = self.front.timeouts.write_s
        waiter.set_exception(ClientStalled(f"the client read nothing for {limit:g} s"))
        self.close_after = True
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        self._buffer = self._buffer + data if self._buffer else data
        if self._busy:
            if len(self._buffer) > _PIPELINE_PAUSE_BYTES and not self._read_paused:
                self._read_paused = True
                self.transport.pause_reading()
            return
        self._next()

    def eof_received(self) -> bool | None:
        return False

    # -- timers ----------------------------------------------------------------------------------

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm_idle(self) -> None:
        """The idle limit counts from now. A timer already armed for it is kept (it fires early and
        re-arms for the rest, see :meth:`_on_timer`): a cancelled and new timer per request cost more
        than the one re-arm per idle period of a busy keep-alive connection."""
        if self._body_wait:
            self._cancel_timer()
            self._body_wait = False
        self._idle_from = self.loop.time()
        if self._timer is None:
            self._timer = self.loop.call_later(self.front.timeouts.idle_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.closed or self._busy:
            return  # a request's end arms the idle limit again
        if self._body_wait:
            self._body_timed_out()
            return
        left = self._idle_from + self.front.timeouts.idle_s - self.loop.time()
        if left > _TIMER_SLACK_S:  # a request came and went since it was armed
            self._timer = self.loop.call_later(left, self._on_timer)
            return
        self.transport.close()  # idle keep-alive, or a head that never completed

    # -- requests --------------------------------------------------------------------------------

    def _next(self) -> None:
        buffer = self._buffer
        if not buffer:
            return
        head = self._head
        if head is None:
            # Only the head's extent is found here: llhttp requires CRLF line ends, so the first blank
            # line ends any head it accepts, and the bytes stay whole for a hand-over.
            end, self._scanned = head_end(buffer, self._scanned)
            if end < 0:
                # An incomplete head goes to aiohttp once too long, or once llhttp refuses what came
                # so far (a bare-LF line end: the CRLF blank line waited for may never come, which
                # left such a request unanswered until the idle limit); aiohttp answers it (400).
                if len(buffer) > _MAX_HEAD_BYTES or self._refused_so_far(buffer):
                    self._hand_over()
                return
            self._drop_probe()
            head = self._parse_head(buffer[: end + 4])
            if head is None:
                self._hand_over()
                return
            self._head = head
        size = head.size + head.length
        if len(buffer) < size:
            if not self._body_wait:
                self._cancel_timer()
                self._body_wait = True
                self._timer = self.loop.call_later(self.front.timeouts.body_s, self._on_timer)
            return
        if head.length and head.parser is not None:
            try:
                head.parser.feed_data(buffer[head.size : size])
            except (httptools.HttpParserError, httptools.HttpParserUpgrade):
                head.complete = False
        head.release()
        if not head.complete:  # llhttp disagrees with the framing: let aiohttp answer it
            self._hand_over()
            return
        if self._body_wait:  # the body deadline; an idle limit's timer is left to run (_arm_idle)
            self._cancel_timer()
            self._body_wait = False
        self._head = None
        self._buffer = buffer[size:]
        self.close_after = not head.keep_alive
        self._busy = True
        body = head.body[0] if len(head.body) == 1 else b"".join(head.body)
        request = HotRequest(self, "POST", head.target, head.headers, body)
        self._running = (request, self.loop.create_task(self._run(request)))

    def _refused_so_far(self, buffer: bytes) -> bool:
        """Whether llhttp already refuses the start of a head (or it carries a header this front
        hands over). Fed only the bytes new since the last call, while no CRLF blank line has come;
        a head that arrives whole is parsed once, in :meth:`_parse_head`, as before."""
        probe = self._probe
        if probe is None:
            probe = self._probe = _RequestParse()
            self._probed = 0
        assert probe.parser is not None
        try:
            probe.parser.feed_data(buffer[self._probed :])
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self._drop_probe()
            return True
        self._probed = len(buffer)
        return False

    def _drop_probe(self) -> None:
        if self._probe is not None:
            self._probe.release()
            self._probe = None

    def _parse_head(self, data: bytes) -> _RequestParse | None:
        """The head of a request this front serves, or None (then aiohttp serves the connection)."""
        head = _RequestParse()
        if self._is_hot(head, data):
            return head
        head.release()
        return None

    def _is_hot(self, head: _RequestParse, data: bytes) -> bool:
        parser = head.parser
        assert parser is not None
        try:
            parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            return False  # malformed, ambiguous, not ours (_NotHot) or an upgrade: aiohttp answers it
        if (
            not head.head_complete
            or head.body
            or head.length < 0
            or head.length > self.front.max_body_bytes
            or head.complete != (head.length == 0)
            or parser.get_method() != b"POST"
            or parser.get_http_version() != "1.1"
            or not head.url.startswith(b"/")
        ):
            return False
        try:
            head.target = head.url.decode("ascii")
        except UnicodeDecodeError:
            return False
        head.size = len(data)
        return head.target.split("?", 1)[0] in self.front.paths

    async def _run(self, request: HotRequest) -> None:
        try:
            result = await self.front.handlers[request.path](request)
            if not request.sent and isinstance(result, web.Response):
                request.send_response(result)
            elif not request.sent:
                raise RuntimeError(f"handler answered {type(result).__name__}, not a web.Response")
        except Exception:
            log.exception("error handling %s %s", request.method, request.path)
            if not request.sent:
                self.close_after = True
                answer = web.json_response(_INTERNAL_ERROR, status=500)
                request.send_response(_named(answer, self.front.refusal_headers, request))
            else:
                self.close_after = True  # a stream cut mid-way: the client sees the connection end
        finally:
            self._done()

    def _done(self) -> None:
        self._busy = False
        self._running = None
        if self.closed:
            return
        if self.close_after:
            self.transport.close()
            return
        if self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()
        self._arm_idle()
        if self._buffer:
            self._next()

    def _body_timed_out(self) -> None:
        """A body still incomplete at the body limit: the app's 408, then close (like the middleware)."""
        head = self._head
        # its headers: the 408 names the client's request id (the gateway's X-Request-Id)
        request = HotRequest(
            self, "POST", head.target if head else "", head.headers if head else CIMultiDict(), b""
        )
        self.close_after = True
        response = self.front.respond(
            request, 408, f"request body not received within {self.front.timeouts.body_s:g} s"
        )
        if isinstance(response, web.Response):
            request.send_response(response)
        self.transport.close()

    def _hand_over(self) -> None:
        """Give this connection (and what it sent so far) to aiohttp's protocol for good."""
        self._cancel_timer()
        self._drop_probe()
        if self._head is not None:
            self._head.release()
            self._head = None
        self.front.connections.discard(self)
        protocol = self.front.fallback()
        if self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()
        self.transport.set_protocol(protocol)
        protocol.connection_made(self.transport)
        buffer, self._buffer = self._buffer, b""
        if buffer:
            protocol.data_received(buffer)


_R = TypeVar("_R", bound=web.StreamResponse)


def _named(response: _R, refusal_headers: RefusalHeaders | None, request: object) -> _R:
    """``response`` (an answer the server gives itself) with ``refusal_headers(request)`` added."""
    if refusal_headers is not None:
        try:
            response.headers.update(refusal_headers(request))
        except Exception:  # the answer goes out anyway: a refusal must not become a crash
            log.exception("naming the answer to a refused request failed")
    return response


class _JsonParseErrors(RequestHandler):
    """aiohttp's protocol, answering a request its parser refuses (a non-ASCII byte in the URL, a bad
    header…) with a 400 in the OpenAI error shape and one log line, instead of plain text and an
    ERROR traceback per malformed request. Every other error keeps aiohttp's handling."""

    __slots__ = ()  # the same layout as RequestHandler: an instance of it can become one of these
    # a server's own headers on these answers (a subclass per server sets it: see _refusals_named)
    refusal_headers: RefusalHeaders | None = None

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        return _named(self._error_answer(request, status, exc, message), type(self).refusal_headers, request)

    def _error_answer(
        self, request: web.BaseRequest, status: int, exc: BaseException | None, message: str | None
    ) -> web.StreamResponse:
        if status != 400 or not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        if isinstance(exc, ContentEncodingError):  # br or zstd: a coding we cannot decode, not a bad request
            coding = coding_in_parser_error(exc.message or "")
            error = {"message": unsupported_message(coding), "type": "invalid_request_error"}
            body = {"error": {**error, "param": "body", "code": 415}}
            return unsupported_answer(web.json_response(body, status=415))
        problem = (exc.message or "malformed request").split("\n", 1)[0].rstrip(": ")
        if isinstance(exc, _BAD_URL):
            problem += " (a request URL must be ASCII: percent-encode other bytes)"
        # a bad method is what TLS or other protocols sent to this port look like: noise, as in aiohttp
        level = logging.DEBUG if isinstance(exc, _BAD_METHOD) else logging.INFO
        log.log(level, "refused a malformed request from %s: %s", request.remote, problem)
        error = {"message": f"malformed HTTP request: {problem}", "type": "invalid_request_error"}
        response = web.json_response({"error": {**error, "param": None, "code": 400}}, status=400)
        response.force_close()
        return response


def _with_json_parse_errors(
    protocol: RequestHandler, cls: type[_JsonParseErrors] = _JsonParseErrors
) -> RequestHandler:
    """``protocol`` (a connection of an aiohttp web.Server) answering parser refusals as
    :class:`_JsonParseErrors` (or ``cls``, one of its subclasses) does (see
    :func:`json_parse_error_connections`)."""
    # web.Server builds plain RequestHandlers and takes no class to build instead. The swap leans on
    # aiohttp's internals (aiohttp>=3.9,<4 in pyproject): should a later aiohttp build the class in
    # C or change its layout, the connection keeps aiohttp's plain-text 400 rather than failing
    # (tests/test_gateway_robustness.py notices)
    with contextlib.suppress(TypeError):
        protocol.__class__ = cls
    return protocol


def _refusals_named(refusal_headers: RefusalHeaders | None) -> type[_JsonParseErrors]:
    """The connection class whose error answers carry ``refusal_headers(request)``: a subclass of
    :class:`_JsonParseErrors` per server (its layout stays RequestHandler's: no instance fields)."""
    if refusal_headers is None:
        return _JsonParseErrors
    fields = {"__slots__": (), "refusal_headers": staticmethod(refusal_headers)}
    return type("_NamedJsonParseErrors", (_JsonParseErrors,), fields)


def json_parse_error_connections(
    runner: web.AppRunner, refusal_headers: RefusalHeaders | None = None
) -> Callable[[], RequestHandler]:
    """A connection factory serving ``runner``'s app (set the runner up first), each connection
    :func:`_with_json_parse_errors`: the front's fallback, and the emulator's every connection.
    ``refusal_headers(request)``: headers added to the answers its protocol gives itself (a head
    its parser refuses: 400; a br/zstd body: 415; an error no middleware answered: 500)."""
    server = runner.server
    assert server is not None, "set the runner up first"
    cls = _refusals_named(refusal_headers)
    return lambda: _with_json_parse_errors(server(), cls)


class HotFront:
    """Protocol factory for ``loop.create_server``: hot paths here, everything else to ``fallback``."""

    def __init__(
        self,
        handlers: Mapping[str, HotHandler],
        fallback: Callable[[], asyncio.Protocol],
        respond: Responder,
        *,
        timeouts: ClientTimeouts,
        max_body_bytes: int,
        refusal_headers: RefusalHeaders | None = None,
    ) -> None:
        self.handlers = dict(handlers)
        self.refusal_headers = refusal_headers  # on the front's own 500, as on aiohttp's refusals
        self.paths: Collection[str] = frozenset(self.handlers)
        self.fallback = fallback
        self.respond = respond
        self.timeouts = timeouts
        self.max_body_bytes = max_body_bytes
        self.loop = asyncio.get_running_loop()
        self.date = _DateHeader()
        # on every answer that keeps its connection (see ClientTimeouts.keep_alive)
        self.keep_alive_line = b"Keep-Alive: %s\r\n" % timeouts.keep_alive.encode()
        self.connections: set[_FrontConnection] = set()

    def __call__(self) -> _FrontConnection:
        return _FrontConnection(self)

    def close_idle(self) -> None:
        for conn in list(self.connections):
            if not conn._busy and not conn.closed:
                conn.transport.close()

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Close idle connections now and busy ones once their answer ended (or at the timeout)."""
        deadline = time.monotonic() + timeout_s
        for conn in self.connections:
            conn.close_after = True
        self.close_idle()
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.transport.abort()


def _advertising_idle_limit(value: str) -> Callable[[web.BaseRequest, web.StreamResponse], Awaitable[None]]:
    """An ``on_response_prepare`` hook: ``Keep-Alive: value`` on every answer that keeps its
    connection (aiohttp has settled that before the hook runs; undecided counts as not)."""

    async def advertise(_request: web.BaseRequest, response: web.StreamResponse) -> None:
        if response.keep_alive:
            response.headers["Keep-Alive"] = value

    return advertise


async def fallback_runner(
    app: web.Application, timeouts: ClientTimeouts, *, shutdown_timeout_s: float = 60.0
) -> web.AppRunner:
    """The set-up aiohttp runner serving what the front hands over, under the same client limits
    (the emulator serves everything with it, having no front).

    handler_cancellation: a client gone before its answer stops the work upstream too, as on the
    front. ``shutdown_timeout_s``: how long cleanup waits for running handlers (aiohttp's default).
    Its answers that keep their connection advertise the idle limit, as the front's do."""
    app.on_response_prepare.append(_advertising_idle_limit(timeouts.keep_alive))
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        handler_cancellation=True,
        shutdown_timeout=shutdown_timeout_s,
        **timeouts.runner_kwargs(),
    )
    await runner.setup()
    return runner


async def serve_front(
    runner: web.AppRunner,
    host: str,
    port: int,
    handlers: Mapping[str, HotHandler],
    respond: Responder,
    *,
    timeouts: ClientTimeouts,
    max_body_bytes: int,
    refusal_headers: RefusalHeaders | None = None,
) -> tuple[asyncio.AbstractServer, HotFront]:
    """Listen on ``host:port`` with the front; ``runner`` (set up) serves what the front hands over
    (``refusal_headers``: see :func:`json_parse_error_connections`)."""
    front = HotFront(
        handlers,
        json_parse_error_connections(runner, refusal_headers),
        respond,
        timeouts=timeouts,
        max_body_bytes=max_body_bytes,
        refusal_headers=refusal_headers,
    )
    server = await asyncio.get_running_loop().create_server(
        front, host, port, reuse_address=True, backlog=128
    )
    return server, front


@dataclass(frozen=True, slots=True)
class FrontServing:
    """The front serving on its socket (see :func:`serving_front`)."""

    server: asyncio.AbstractServer
    front: HotFront

    @property
    def port(self) -> int:
        return int(self.server.sockets[0].getsockname()[1])


@contextlib.asynccontextmanager
async def serving_front(
    app: web.Application,
    host: str,
    port: int,
    handlers: Mapping[str, HotHandler],
    respond: Responder,
    *,
    timeouts: ClientTimeouts,
    max_body_bytes: int,
    refusal_headers: RefusalHeaders | None = None,
) -> AsyncIterator[FrontServing]:
    """Serve ``app`` behind the front on ``host:port`` until the block ends: the front takes the
    paths in ``handlers``, aiohttp (see :func:`fallback_runner`) everything else; ``refusal_headers``
    names the answers aiohttp's protocol gives before the app sees a request (see
    :func:`json_parse_error_connections`)."""
    runner = await fallback_runner(app, timeouts)
    try:
        server, front = await serve_front(
            runner,
            host,
            port,
            handlers,
            respond,
            timeouts=timeouts,
            max_body_bytes=max_body_bytes,
            refusal_headers=refusal_headers,
        )
    except BaseException:
        await runner.cleanup()
        raise
    try:
        yield FrontServing(server, front)
    finally:
        server.close()
        await front.shutdown()
        await runner.cleanup()
