"""Which compressed request bodies the gateway and the sidecar read, and the answer to the rest.

aiohttp decodes a body in ``gzip`` or ``deflate`` (one Content-Encoding line naming just that
coding); ``br`` and ``zstd`` only with optional packages we do not install (without them its parser
answers a plain-text 400 telling the client to install Brotli), and any other coding not at all: the
handler would read the still-encoded bytes as if they were plain. A body in a coding we cannot
decode is answered 415 Unsupported Media Type with ``Accept-Encoding`` naming the ones we can
(RFC 9110 §15.5.16), in the OpenAI error shape of every other answer. The lean front hands every
request with a Content-Encoding to aiohttp (:mod:`.front`), so both paths behave alike.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

DECODED_CODINGS = ("gzip", "deflate")  # what aiohttp decodes without optional packages
ACCEPT_ENCODING = ", ".join(DECODED_CODINGS)
NO_CODING = ("", "identity")  # Content-Encoding values that name no coding
# aiohttp's parser names a coding it cannot decode as "... brotli (br). Please install ..."
_NAMED_IN_PARENS = re.compile(r"\(([A-Za-z0-9_.-]+)\)")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Responder = Callable[[web.Request, int, str], web.StreamResponse]


def unsupported_coding(values: Sequence[str]) -> str | None:
    """The Content-Encoding (its header lines joined) when the body arrives in a coding aiohttp did
    not decode; None when it is plain or was decoded. ``identity`` is no coding; a list of codings
    (``gzip, br``) or several header lines is one aiohttp leaves encoded, so it is unsupported."""
    if names_no_coding(values) or decoded_by_aiohttp(values):
        return None
    return ", ".join(v.strip() for v in values)


def names_no_coding(values: Sequence[str]) -> bool:
    """Whether these Content-Encoding header lines (none, or only ``identity``) leave the body as
    sent: its Content-Length is then its size as read."""
    return all(c.strip().lower() in NO_CODING for value in values for c in value.split(","))


def decoded_by_aiohttp(values: Sequence[str]) -> bool:
    """Whether aiohttp's parser decodes a body sent with these Content-Encoding header lines."""
    return len(values) == 1 and values[0].strip().lower() in DECODED_CODINGS


def unsupported_message(coding: str) -> str:
    return (
        f"request body Content-Encoding {coding!r} is not supported; send it uncompressed or "
        f"as one of: {ACCEPT_ENCODING}"
    )


def coding_in_parser_error(message: str) -> str:
    """The coding aiohttp's parser refused to decode, as its error message names it."""
    found = _NAMED_IN_PARENS.search(message)
    return found.group(1) if found else "unknown"


def unsupported_answer(response: web.StreamResponse) -> web.StreamResponse:
    """``response`` (a 415) with the Accept-Encoding RFC 9110 asks for; the connection closes. In the
    apps the body is not read, then dropped while the client sends (``drain_refused_bodies``, outside
    this middleware), so a client still uploading reads the 415; a parser refusal (br, zstd) closes
    at once: aiohttp cannot frame the rest."""
    response.headers["Accept-Encoding"] = ACCEPT_ENCODING
    response.force_close()
    return response


async def read_body(request: web.Request) -> bytes:
    """The whole body, as ``request.read()`` answers it from then on; above the app's
    ``client_max_size`` (counted decoded) :class:`~aiohttp.web.HTTPRequestEntityTooLarge`.

    A body aiohttp decodes is read in the stream's own small steps, stopping as soon as the decoded
    size passes the limit: peak memory about the limit. ``request.read()`` first widens the stream
    buffer to the whole limit, so aiohttp inflated a compression bomb in steps of the limit and held
    ~7-9x the limit before its size check ran. The steps are small since aiohttp 3.13.3 (its decoder
    yields at most ~64 KiB per call and the stream pauses while its buffer is full); an older one
    inflates each received chunk whole (up to ~64 MiB from a 64 KiB read of a bomb)."""
    if not decoded_by_aiohttp(request.headers.getall("Content-Encoding", [])):
        return await request.read()
    if request._read_bytes is not None:  # already read (and bounded) once
        return request._read_bytes
    limit = request.client_max_size
    body = bytearray()
    async for chunk in request.content.iter_any():
        body += chunk
        if limit and len(body) > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(body))
    # where request.read() keeps the body it read: every later read (read, json, text) answers it;
    # aiohttp offers no public way to hand a request the body read from its stream
    request._read_bytes = bytes(body)
    return request._read_bytes


def content_coding(respond: Responder) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Middleware (before :func:`~.slow_clients.body_deadline`, which reads the body): a body in a
    coding we cannot decode is a 415, a body that does not decode as its coding (``gzip`` over
    plain bytes) a 400; ``respond(request, status, message)`` shapes the error answer."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        values = request.headers.getall("Content-Encoding", [])
        if values and request.body_exists:
            coding = unsupported_coding(values)
            if coding is not None:
                return unsupported_answer(respond(request, 415, unsupported_message(coding)))
        try:
            return await handler(request)
        except RequestPayloadError:
            if not values:
                raise  # a framing error, not ours to name
            # the body read failed to decode: the client's fault (a 500 before), the connection ends.
            # Its rest is never read: aiohttp would linger reading it, meet the stored error again
            # and log it as an unhandled exception.
            request.content.feed_eof()
            shown = ", ".join(values)
            response = respond(
                request, 400, f"request body cannot be decoded as its Content-Encoding {shown!r}"
            )
            response.force_close()
            return response

    return middleware
