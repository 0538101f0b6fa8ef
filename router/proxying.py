"""HTTP reverse-proxy plumbing shared by the sidecar and the gateway (aiohttp, no routing logic)."""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import StreamReader, hdrs, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler
from aiohttp.web_protocol import RequestPayloadError
from aiohttp.web_urldispatcher import _default_expect_handler
from multidict import CIMultiDict, MultiMapping
from pydantic import ValidationError

from prefixfleet.sglang_fields import AS_BOOL

from .content_coding import content_coding
from .control import CONTROL_HEADER
from .front import ClientStalled, HotRequest, HotStream, StallWatch
from .requests import BadRequest, load_json_object
from .slow_clients import ClientTimeouts, Responder, body_deadline, declared_too_large, too_large
from .upstream import UpstreamClosed

AnyRequest = web.Request | HotRequest
Answer = web.StreamResponse | HotStream

# Connection-scoped headers never forwarded (RFC 9110 §7.6.1) plus ones aiohttp recomputes.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",  # not standard, but sent by some clients as Connection's old name
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",  # upstream answers uncompressed so bytes can be inspected and re-chunked
        "content-encoding",
    }
)
# Not hop-by-hop, but never passed on either: the fleet's control token is for the sidecar that checks
# it, and forwarded it would land in the engine's request logs (and a gateway's client's in a sidecar's)
NOT_FORWARDED = HOP_BY_HOP | {CONTROL_HEADER.lower()}
RETRYABLE_HEADER = "X-Prefixfleet-Retryable"
WORKER_HEADER = "X-Prefixfleet-Worker"
_CACHED_TOKENS = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')


def hop_by_hop(headers: MultiMapping[str]) -> frozenset[str]:
    """The lower-cased names of a message's headers not to pass on: :data:`NOT_FORWARDED` and those
    its ``Connection`` header lists (RFC 9110 §7.6.1: meant for that connection only)."""
    listed = headers.getall("Connection", ())
    if not listed:
        return NOT_FORWARDED
    return NOT_FORWARDED.union(name.strip().lower() for line in listed for name in line.split(","))


def forward_header_pairs(headers: MultiMapping[str]) -> list[tuple[str, str]]:
    """The end-to-end request headers (repeats kept) as pairs, for :class:`~.upstream.UpstreamPool`."""
    dropped = hop_by_hop(headers)
    return [(k, v) for k, v in headers.items() if k.lower() not in dropped]


def answer_headers(headers: MultiMapping[str]) -> CIMultiDict[str]:
    """An upstream response's end-to-end headers, to answer the client with."""
    dropped = hop_by_hop(headers)
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in dropped)


def request_target(request: AnyRequest) -> str:
    """The path and query to send upstream, as the client wrote them (no re-encoding)."""
    raw = request.raw_path
    return raw if raw.startswith("/") else request.rel_url.raw_path_qs


async def open_stream(
    request: AnyRequest, status: int, headers: Mapping[str, str]
) -> web.StreamResponse | HotStream:
    """Send a streamed answer's head; the result takes ``write(chunk)`` and ``write_eof()``."""
    if isinstance(request, HotRequest):
        return request.start_stream(status, headers)
    response = web.StreamResponse(status=status, headers=headers)
    await response.prepare(request)
    return response


def stream_writer(
    request: AnyRequest, response: web.StreamResponse | HotStream, timeout_s: float
) -> Callable[[bytes], Awaitable[None]]:
    """``write(chunk)`` for a streamed answer that raises :class:`~.front.ClientStalled` (and closes
    the connection) when a write waits on a client reading nothing longer than ``timeout_s``. The
    front's stream arms that timer itself, only when a write has to wait; aiohttp's (the unusual
    requests the front hands over) is timed here."""
    if isinstance(response, HotStream):
        return response.write
    assert isinstance(request, web.Request)
    return functools.partial(_write_within, request, response, timeout_s)


async def _write_within(
    request: web.Request, response: web.StreamResponse, timeout_s: float, data: bytes
) -> None:
    transport = request.transport
    if transport is None:  # the client is gone: aiohttp's write says so
        await response.write(data)
        return
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(None) as scope:
            watch = StallWatch(loop, transport, timeout_s, lambda: scope.reschedule(loop.time()))
            try:
                await response.write(data)
            finally:
                watch.cancel()
    except TimeoutError:
        transport.abort()  # as the front does: the client sees its connection end
        raise ClientStalled(f"the client read nothing for {timeout_s:g} s") from None


def answer_began(request: AnyRequest) -> bool:
    """Whether any byte of the answer went to the client (read when a handler is cancelled)."""
    if isinstance(request, HotRequest):
        return request.sent
    return request.writer.output_size > 0


async def answer_now(request: AnyRequest, response: web.Response) -> None:
    """Send a whole answer before the handler returns (it still has bookkeeping to do)."""
    if isinstance(request, HotRequest):
        request.send_response(response)
        return
    await response.prepare(request)
    await response.write_eof()


def json_error(
    status: int, message: str, *, kind: str | None = None, param: str | None = None, retryable: bool = False
) -> web.Response:
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    headers = {RETRYABLE_HEADER: "1"} if retryable else None
    return web.json_response(body, status=status, headers=headers)


@web.middleware
async def json_route_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """An unknown path (404) or method (405) answered in the same OpenAI error shape as the rest
    (aiohttp's own answers are plain text)."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(sorted(exc.allowed_methods))
        response = json_error(
            405, f"method {request.method} is not allowed on {request.path} (allowed: {allowed})"
        )
        response.headers["Allow"] = exc.headers["Allow"]
        return response
    except web.HTTPNotFound:
        return json_error(404, f"no endpoint {request.method} {request.path}")


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """An admin endpoint's body as a JSON object; :class:`BadRequest` (400, or 413 above the app's
    body limit) otherwise. Read as bytes: JSON is UTF-8 whatever charset the Content-Type names
    (``request.json()`` decodes by it: an unknown charset raised LookupError, a 500)."""
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BadRequest(
            f"request body exceeds {request.client_max_size} bytes", status=413, param="body"
        ) from None
    return load_json_object(body)


def bad_request(exc: BadRequest) -> web.Response:
    """The OpenAI error answer for ``exc``."""
    return json_error(exc.status, str(exc), param=exc.param)


def failure_text(exc: BaseException) -> str:
    """An upstream failure as named to the client: its class, and for an upstream that broke the
    protocol (:class:`~.upstream.UpstreamClosed`) what was wrong, as the upstream client put it."""
    if isinstance(exc, UpstreamClosed) and str(exc):
        return f"{exc.__class__.__name__}: {exc}"
    return exc.__class__.__name__


def error_message(body: bytes) -> str | None:
    """``error.message`` of an OpenAI-shaped error answer (a sidecar's 502 says why), else None."""
    try:
        obj: Any = json.loads(body)
        message = obj["error"]["message"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        return None
    return message[:500] if isinstance(message, str) else None


def sse_error_event(message: str, kind: str = "upstream_disconnected") -> bytes:
    """An SSE event that ends a stream cut short: OpenAI-style error object on a data line."""
    payload = {"error": {"message": message, "type": kind, "code": 502}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


# The end of the last event in a buffer: a line end then a blank line's end (SSE line ends are CRLF,
# LF or CR). The leading ``.*`` is greedy, so the scan starts from the buffer's end and stops at the
# nearest event end; ``\r(?!\n)`` keeps a CRLF from being read as two line ends.
_LAST_EVENT_END = re.compile(rb"(?s:.*)(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r|\n)")
_EVENT_ENDS = (b"\n\n", b"\r\n\r\n", b"\r\r")
# Whole comment or blank lines at the start of an event (a CR at the buffer's end may be half a
# CRLF: wait). A blank line there ends an event with no field: a client dispatches nothing.
_LEADING_NO_FIELD_LINES = re.compile(rb"(?:(?::[^\r\n]*)?(?:\r\n|\n|\r(?=[^\n])))+")
_NO_FIELD_LINE_STARTS = (b":", b"\n", b"\r")
MAX_HELD_EVENT_BYTES = 8 * 1024 * 1024


def complete_events_end(tail: bytes, chunk: bytes) -> int:
    """How many leading bytes of ``chunk`` end at the stream's last event end, ``-1`` if none does.
    ``tail``: up to the last 3 bytes received before ``chunk`` since the previous event end (a blank
    line may straddle the two)."""
    if chunk.endswith(_EVENT_ENDS):
        return len(chunk)
    found = _LAST_EVENT_END.match(tail + chunk if tail else chunk)
    if found is None or found.end() <= len(tail):
        return -1
    return found.end() - len(tail)


async def whole_events(
    chunks: AsyncIterator[bytes], max_held: int = MAX_HELD_EVENT_BYTES
) -> AsyncIterator[bytes]:
    """An SSE body's bytes in pieces that each end where no event is half sent: at an event end, or
    after comment or blank lines (``: ping``) that begin the next event. An incomplete trailing event is held
    back until its blank line arrives; the whole body still comes out byte for byte.

    Why: when the upstream breaks off, the hop appends its own error event. After a partial event
    no bytes can withdraw it (an SSE client joins every data line until a blank line), so the client
    saw one merged, unparseable event. Holding the partial back and dropping it on a cut leaves the
    client whole events only, the error event last: what the OpenAI SDK or sglang-router parse.
    Comment lines change no event, so a heartbeat sent without a blank line still goes on at once.
    Engines send whole events per write, so the hot path is one ``endswith`` per chunk; otherwise
    only the new bytes (and 3 before them) are scanned. An "event" above ``max_held`` bytes is
    passed on unframed (bounded memory; a cut inside it then leaves the client a broken event)."""
    held = bytearray()
    async for chunk in chunks:
        if not held:
            if chunk.endswith(_EVENT_ENDS):
                yield chunk
                continue
            end = complete_events_end(b"", chunk)
        else:
            end = complete_events_end(bytes(held[-3:]), chunk)
        if end < 0:
            out = b""
            held += chunk
        else:
            out = bytes(held) + chunk[:end] if held else chunk[:end]
            held[:] = chunk[end:]
        # Only once a line end came (or the byte after a CR): a long comment line arriving in
        # pieces is not rescanned from its start for every piece.
        new = max(0, len(held) - len(chunk) - 1)
        if held[:1] in _NO_FIELD_LINE_STARTS and (held.find(b"\n", new) >= 0 or held.find(b"\r", new) >= 0):
            comments = _LEADING_NO_FIELD_LINES.match(held)
            if comments is not None:
                out += bytes(held[: comments.end()])
                del held[: comments.end()]
        if len(held) > max_held:
            out += bytes(held)
            held.clear()
        if out:
            yield out
    if held:  # the body ended cleanly inside an event: pass it on as sent
        yield bytes(held)


def is_error_event(chunk: bytes) -> bool:
    """Whether a streamed chunk opens with an SSE error event (:func:`sse_error_event`'s shape, or an
    engine's own): at a stream's start it means no token came, so nothing was prefilled."""
    return chunk.startswith(b'data: {"error"')


def find_cached_tokens(data: bytes, *, absent_is_zero: bool = False) -> int | None:
    """The engine's ``cached_tokens`` (SGLang meta_info or OpenAI usage details) if the bytes hold
    one; None: unknown. SGLang's OpenAI usage has ``prompt_tokens_details`` only when started with
    --enable-cache-report, and then only when N > 0 (vLLM's only with --enable-prompt-tokens-details,
    likewise): an OpenAI usage report (``prompt_tokens``) without it is 0 only for an engine known to
    report them (``absent_is_zero``: its server info says enable_cache_report), else unknown, never
    a 0 that would make the mirror evict what the engine may well hold."""
    found = _CACHED_TOKENS.findall(data)
    if found:
        return int(found[-1])
    return 0 if absent_is_zero and _PROMPT_TOKENS.search(data) else None


def find_uncached_tokens(
    data: bytes, fallback_prompt_tokens: int, *, absent_is_zero: bool = False
) -> int | None:
    """Prompt tokens the engine actually prefilled, from its own usage report (None if absent)."""
    cached = find_cached_tokens(data, absent_is_zero=absent_is_zero)
    if cached is None:
        return None
    prompts = _PROMPT_TOKENS.findall(data)
    prompt = int(prompts[-1]) if prompts else fallback_prompt_tokens
    return max(prompt - cached, 0)


def answer_uncached_tokens(
    path: str, body: bytes, fallback_prompt_tokens: int, *, absent_is_zero: bool = False
) -> int | None:
    """Prompt tokens the engine prefilled for a whole (not streamed) answer, by its own counts: the
    whole request's, as completions' usage already sums a batch's prompts. A /generate batch answers
    a list, each item with its own prompt's counts: they are summed (the last item alone is one
    prompt's). None if the answer holds no counts."""
    if path == "/generate" and body[:64].lstrip().startswith(b"["):
        try:
            items: Any = json.loads(body)
            total = 0
            for item in items:
                meta = item["meta_info"]
                prompt, cached = meta["prompt_tokens"], meta["cached_tokens"]
                if not isinstance(prompt, int) or not isinstance(cached, int):
                    return None
                total += max(prompt - cached, 0)
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
            return None
        return total
    return find_uncached_tokens(body, fallback_prompt_tokens, absent_is_zero=absent_is_zero)


def output_text(path: str, body: bytes) -> str | None:
    """The generated text of a non-streaming response (the engine caches prompt + output)."""
    try:
        obj: Any = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    try:
        # A batch's answer lists its prompts in order (SGLang's choices are prompt-major: prompt
        # index = choice index // n; so are the emulator's): the first item is the first prompt's,
        # the one a batch is mirrored by.
        if path == "/generate":
            item = obj[0] if isinstance(obj, list) else obj
            text = item.get("text")
        elif path == "/v1/completions":
            text = obj["choices"][0].get("text")
        else:
            text = obj["choices"][0]["message"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    return text if isinstance(text, str) else None


# The key "echo" as JSON may spell it: each letter itself or its \u escape (none has a short one;
# hex digits in either case). Only searched when the body holds a \u at all.
_ESCAPED_ECHO_KEY = re.compile(rb'"(?:e|\\u0065)(?:c|\\u0063)(?:h|\\u0068)(?:o|\\u006[fF])"')


def may_ask_echo(body: bytes) -> bool:
    """False only when the JSON in ``body`` cannot have an ``echo`` key, judged without parsing it
    (the hot path): no literal ``"echo"``, no key spelling it with ``\\u`` escapes, and UTF-8 (json.loads,
    like the engine's parser, also reads UTF-16 and UTF-32, where the bytes differ). A True may be a
    false alarm (the bytes inside a string): the caller then parses."""
    if b'"echo"' in body or not json.detect_encoding(body).startswith("utf-8"):
        return True
    # a one-byte search is a memchr (nearly free); most bodies without escapes stop there
    return b"\\" in body and b"\\u" in body and _ESCAPED_ECHO_KEY.search(body) is not None


def echoed_prompt(path: str, body: bytes) -> str | None:
    """The text an answer repeats before its output: with ``echo`` SGLang's /v1/completions starts
    each choice's text with its prompt (the emulator refuses echo), so the first choice (the first
    prompt's) starts with the first prompt; '' when nothing is echoed. None when a prompt of token
    ids is echoed: the engine's own tokenizer decodes it, so where its output starts is unknown."""
    if path != "/v1/completions" or not may_ask_echo(body):
        return ""
    try:
        obj: Any = json.loads(body)
        echo = AS_BOOL.validate_python(obj.get("echo") or False)
    except (ValueError, RecursionError, AttributeError, ValidationError):
        # (ValueError: also UnicodeDecodeError, JSONDecodeError, an integer past Python's digit limit)
        return None  # the engine judges such a request; nothing to learn from it here
    if not echo:
        return ""
    prompt = obj.get("prompt")
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


def after_echo(text: str, echoed: str | None) -> str | None:
    """The output in an answer's ``text``: what follows ``echoed`` (:func:`echoed_prompt`). None
    when the text does not start with it: learning nothing beats mirroring a wrong output."""
    if echoed is None or not text.startswith(echoed):
        return None
    return text[len(echoed) :]


def _first_choice(item: Any) -> bool:
    """Whether a stream's event (SGLang's native one) or choice is choice 0's: its ``index`` is 0
    or absent (a single choice). Raises AttributeError for a non-object, as the callers expect."""
    return item.get("index", 0) == 0


class StreamedText:
    """Collects the generated text of a server-sent-event stream, chunk by chunk (for the mirror).

    SGLang's native stream repeats the whole text so far in each event; OpenAI streams deltas.
    Events may be split across chunks, so partial lines are buffered (bounded by ``max_bytes``).

    Only choice 0's text is collected. With ``n`` > 1 the engine samples each choice as its own
    sequence and caches each one's prompt + output (SGLang's radix cache keeps them all); the
    stream interleaves the choices' events, each naming its choice by ``index`` (per choice in
    completions and chat, per event in SGLang's native stream; absent: the only choice). Joining
    them made an output no choice produced, a branch the engine never holds; choice 0's is one it
    does (the others are left out, as a whole answer is mirrored by its first choice).
    """

    def __init__(self, path: str, max_bytes: int = 4 * 1024 * 1024) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._buffer = b""
        self._parts: list[str] = []
        self._cumulative = ""
        self.overflow = False

    def feed(self, chunk: bytes) -> None:
        if self.overflow:
            return
        data = self._buffer + chunk
        lines = data.split(b"\n")
        self._buffer = lines.pop()
        if len(self._buffer) > self.max_bytes:
            self.overflow = True
            return
        for line in lines:
            if line.startswith(b"data: {"):
                self._event(line[6:])

    def _event(self, raw: bytes) -> None:
        try:
            obj: Any = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return
        try:
            if self.path == "/generate":
                text = obj.get("text")
                if isinstance(text, str) and _first_choice(obj):
                    self._cumulative = text
                return
            choice = next(filter(_first_choice, obj["choices"]), None)
            if choice is None:
                return  # another choice's event, or none (a usage event)
            if self.path == "/v1/completions":
                text = choice.get("text")
            else:
                text = choice.get("delta", {}).get("content")
            if isinstance(text, str):
                self._parts.append(text)
        except (KeyError, TypeError, AttributeError):
            return

    @property
    def text(self) -> str | None:
        if self.overflow:
            return None
        if self.path == "/generate":
            return self._cumulative or None
        return "".join(self._parts) or None


@dataclass(frozen=True, slots=True)
class DrainLimits:
    """How much of a refused body (an error answered before it was read whole) is read and dropped
    after its answer. A client that sends its whole body before it reads (httpx, requests, most
    scripts) only sees the answer if the server keeps reading until it is done: closing with the
    upload still coming resets the connection, and the client gets a ReadError with no message. So,
    like nginx's lingering close (lingering_timeout 5 s, lingering_time 30 s), the rest is dropped for
    as long as the client keeps sending, bounded so a hostile client cannot hold the connection: a
    pause above ``idle_s`` between pieces, more than ``total_s`` in all or more than ``max_bytes``
    dropped, and the connection is closed."""

    idle_s: float = 5.0
    total_s: float = 30.0
    max_bytes: int = 64 * 1024 * 1024

    def within(self, body_s: float) -> DrainLimits:
        """These limits held to the body timeout (``ClientTimeouts.body_s``, the time a whole body may
        take to arrive): a deployment that shortens it against slow clients keeps that bound for a
        refused upload too, as it did for aiohttp's lingering close (``runner_kwargs``). Else a
        client declaring a length above the limit, or a coding we refuse, then trickling a byte every
        few seconds, held the connection ``total_s`` whatever the body timeout."""
        return replace(self, idle_s=min(self.idle_s, body_s), total_s=min(self.total_s, body_s))


DRAIN_LIMITS = DrainLimits()


def worth_draining(declared_length: int | None, received: int, limits: DrainLimits) -> bool:
    """Whether to read the rest of a refused body of which ``received`` bytes had arrived when it
    was answered: not when its declared Content-Length is more than ``limits.max_bytes`` past that.
    Such a body cannot end within the cap, so draining part of it would only delay the same reset,
    after spending the bandwidth; a client declaring it knew its size before sending, and the answer
    still goes out first for one that reads while it sends. A chunked body (no declared length) is
    drained and cut at the cap. (``received`` counts decoded bytes for a gzip body, its length the
    encoded ones: such a body may be drained and cut at the cap.)"""
    return declared_length is None or declared_length - received <= limits.max_bytes


def drained_after(status: int) -> bool:
    """Whether an answer with this status, sent before the request body was read whole, is followed
    by draining the body: every error (413 too large, 415 unsupported coding, ...: the client is
    still sending and would meet a reset instead of the answer) but 408. A 408 means the body did
    not arrive within the body limit: the client stalled (nothing in flight to reset) or trickles,
    and draining would hand a slow client the connection for another ``total_s``, the very thing
    the 408 ends. A success answered before its body was read is aiohttp's own business."""
    return status >= 400 and status != 408


async def drain_rest(content: StreamReader, limits: DrainLimits, received: int) -> bool:
    """Read and drop what is left of a request body of which ``received`` bytes had arrived (in the
    stream's count, ``total_bytes``) when it was answered; True once it ended within ``limits``,
    False when a limit cut it off or the connection failed (reset, broken framing). The byte cap
    counts from ``received``, as :func:`worth_draining` does."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.total_s
    while content.total_bytes - received <= limits.max_bytes:
        wait = min(limits.idle_s, deadline - loop.time())
        if wait <= 0:
            return False
        try:
            async with asyncio.timeout(wait):
                chunk = await content.readany()
        except (TimeoutError, ConnectionError, HttpProcessingError, RequestPayloadError):
            return False
        if not chunk:
            return True
    return False


async def answer_then_drain(
    request: web.Request, response: web.Response, limits: DrainLimits = DRAIN_LIMITS
) -> None:
    """Send ``response`` (an error answered before the body was read whole) at once, then drop the
    body's rest within ``limits``. The connection then closes: cleanly (FIN) when the body ended, so
    the client reads the answer; at once otherwise (aiohttp would linger another ``lingering_time``
    first)."""
    response.force_close()
    # read before answering: the bytes that arrive while the answer is written are part of the rest
    received = request.content.total_bytes
    try:
        await answer_now(request, response)
    except ConnectionError:  # the client left: nothing to drain (aiohttp's own write says so again)
        return
    if request.content.is_eof():
        return
    if worth_draining(request.content_length, received, limits) and await drain_rest(
        request.content, limits, received
    ):
        return
    request.protocol.force_close()


def drain_refused_bodies(limits: DrainLimits = DRAIN_LIMITS) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Middleware, outside the body middleware (:func:`~.content_coding.content_coding`'s 415 and
    :func:`~.slow_clients.body_deadline`'s 413 are answered before the body was read whole): such an
    error answer is sent, then the body's rest dropped (:func:`answer_then_drain`); which errors,
    :func:`drained_after`."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        if (
            drained_after(response.status)
            and isinstance(response, web.Response)
            and not response.prepared
            and not request.content.is_eof()
        ):
            await answer_then_drain(request, response, limits)
        return response

    return middleware


ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]


def expect_within_limit(respond: Responder, limits: DrainLimits = DRAIN_LIMITS) -> ExpectHandler:
    """Expect handler (``expect_handler=`` of ``add_route``) for every route that takes a body: a
    request asking ``Expect: 100-continue`` for a body whose declared length is already above the
    limit (:func:`~.slow_clients.declared_too_large`) gets the final 413 at once, in place of
    ``100 Continue`` (RFC 9110 section 10.1.1), so the client does not upload what would be dropped.
    Any other request gets aiohttp's default: ``100 Continue``, or 417 for another expectation.
    aiohttp returns this answer as is, without the middlewares (they run after the expect handler),
    so it is built with the services' ``respond`` and sent as :func:`drain_refused_bodies` sends
    theirs: a client that sends its body without waiting for the 100 reads the 413, not a reset."""

    async def expect_handler(request: web.Request) -> web.StreamResponse | None:
        expects_continue = request.headers.get(hdrs.EXPECT, "").lower() == "100-continue"
        codings = request.headers.getall(hdrs.CONTENT_ENCODING, [])
        if expects_continue and declared_too_large(request.content_length, request.client_max_size, codings):
            response = too_large(request, respond)
            if isinstance(response, web.Response):
                await answer_then_drain(request, response, limits)
            return response
        # aiohttp's own (private, the documented default of add_route): no copy to drift from it
        await _default_expect_handler(request)
        return None

    return expect_handler


@dataclass(frozen=True, slots=True)
class BodyGuards:
    """How a service (gateway, sidecar, emulator) takes request bodies, in one place: its middlewares,
    outermost first (a refused body's rest drained, then the Content-Encoding judged, then the body
    read within the time and size limits), and the ``expect_handler`` of every route taking a body."""

    middlewares: tuple[Callable[..., Awaitable[web.StreamResponse]], ...]
    expect_handler: ExpectHandler


def body_guards(timeouts: ClientTimeouts, respond: Responder) -> BodyGuards:
    """The :class:`BodyGuards` of a service whose body errors ``respond`` shapes; the drain is held to
    the body timeout (:meth:`DrainLimits.within`)."""
    drain = DRAIN_LIMITS.within(timeouts.body_s)
    return BodyGuards(
        (drain_refused_bodies(drain), content_coding(respond), body_deadline(timeouts, respond)),
        expect_within_limit(respond, drain),
    )
