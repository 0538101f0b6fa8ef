"""A relayed SSE stream reaches the client as whole events, the hop's error event last.

Specification:
- When the engine's stream is cut inside an event (``data: {"text": "ab`` sent, then the connection
  dropped), the sidecar and the gateway each end the client's stream with their own error event
  after the last whole event: the partial event is dropped, never merged with the error event.
  Every event the client parses holds JSON (or ``[DONE]``) and the last one is the error.
- A stream that ends normally arrives byte for byte as the engine wrote it, however its writes
  split it (inside a ``data:`` line, inside the blank line, CRLF or CR line ends).

Real HTTP on 127.0.0.1: a stand-in engine (tests/stall_clients.py's ``CuttingEngine``, or a
splitting one here), the real sidecar and gateway (``listening``), an aiohttp client.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import relayed, serve_aiohttp
from hypothesis import given, settings
from hypothesis import strategies as st
from stall_clients import FIRST_EVENT, CuttingEngine

from prefixfleet.router.proxying import whole_events

pytestmark = pytest.mark.timeout(60)

PARTIAL_EVENT = b'data: {"choices": [{"text": "ab'
HOPS = ["sidecar", "gateway", "gateway+sidecar"]


def sse_events(body: bytes) -> list[str]:
    """The data of each event an SSE client dispatches (WHATWG parsing: CRLF, LF or CR line ends;
    data lines joined by LF; an event with no data line is not dispatched)."""
    events: list[str] = []
    data: list[str] | None = None
    text = body.decode().replace("\r\n", "\n").replace("\r", "\n")
    for line in text.split("\n"):
        if not line:
            if data is not None:
                events.append("\n".join(data))
            data = None
        elif line.startswith("data:"):
            value = line[5:].removeprefix(" ")
            data = [*(data or []), value]
    return events


def half_sent_event(stream: bytes) -> bool:
    """Whether a client that received ``stream`` holds part of an event it cannot complete: an
    unfinished line, or a field line since the last blank line (comment lines change nothing)."""
    lines = stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    if lines.pop():
        return True  # the last line has no line end yet
    pending = False
    for line in lines:
        if not line:
            pending = False
        elif not line.startswith(b":"):
            pending = True
    return pending


async def stream_body(url: str) -> bytes:
    body = {"prompt": "hello", "stream": True, "max_tokens": 4}
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        return await resp.content.read()


@pytest.mark.parametrize("hops", HOPS)
@pytest.mark.parametrize("line_end", [b"\n", b"\r\n"])
async def test_a_stream_cut_inside_an_event_ends_with_whole_events_and_the_error_last(
    hops: str, line_end: bytes
) -> None:
    engine = CuttingEngine()
    second = b'data: {"choices": [{"text": "b"}]}' + line_end + line_end
    async with engine.serving() as engine_url, relayed(hops, engine_url) as url:
        client = asyncio.create_task(stream_body(url))
        await engine.feed.put(second)
        await engine.feed.put(PARTIAL_EVENT)
        await asyncio.sleep(0.05)  # let the partial event reach the hops before the cut (not required)
        await engine.feed.put(None)
        body = await client

    assert body.startswith(FIRST_EVENT + second)
    assert PARTIAL_EVENT not in body
    events = sse_events(body)
    parsed = [json.loads(data) for data in events if data != "[DONE]"]
    assert len(parsed) == len(events) == 3
    assert parsed[-1]["error"]["type"] == "upstream_disconnected"
    assert "ended early" in parsed[-1]["error"]["message"]


@pytest.mark.parametrize("hops", HOPS)
async def test_a_comment_line_without_a_blank_line_is_passed_on_at_once(hops: str) -> None:
    """A heartbeat (``: ping``) changes no event, so it is not held back; a cut after it still ends
    the stream with whole events."""
    engine = CuttingEngine()
    async with (
        engine.serving() as engine_url,
        relayed(hops, engine_url) as url,
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/completions", json={"prompt": "hello", "stream": True}) as resp,
    ):
        await engine.feed.put(b": ping\n")
        received = b""
        async with asyncio.timeout(10):  # a liveness bound, not a timing claim
            while not received.endswith(b": ping\n"):
                received += await resp.content.readany()
        assert received == FIRST_EVENT + b": ping\n"
        await engine.feed.put(PARTIAL_EVENT)
        await engine.feed.put(None)
        received += await resp.content.read()
    assert received.startswith(FIRST_EVENT + b': ping\ndata: {"error"')
    assert [json.loads(data)["error"]["type"] for data in sse_events(received)[1:]] == [
        "upstream_disconnected"
    ]


def test_half_sent_event_reads_a_stream_as_an_sse_client_does() -> None:
    assert not half_sent_event(FIRST_EVENT + b": ping\r\n")
    assert half_sent_event(FIRST_EVENT + b"data: {}\n")
    assert half_sent_event(b": pi")


class SplittingEngine:
    """Streams ``pieces`` as separate writes, then ends the stream normally."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in self.pieces:
            await response.write(piece)
            await asyncio.sleep(0.01)  # separate writes usually arrive as separate reads
        await response.write_eof()
        return response

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/health", self.health)
        async with serve_aiohttp(app) as url:
            yield url


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted({c % (len(data) + 1) for c in cuts}), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


NORMAL_STREAM = (
    b'data: {"choices": [{"text": "a"}]}\n\n'
    b": keep-alive comment\n\n"
    b": a comment before an event's fields\r\n"
    b'data: {"choices": [{"text": "b"}]}\r\n\r\n'
    b'data: {"choices": [{"text": "c"}]}\r\r'
    b'data: {"choices": [{"text": "d"}],\ndata: "usage": {"cached_tokens": 3}}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("hops", HOPS)
async def test_a_normal_stream_split_anywhere_arrives_byte_identical(hops: str) -> None:
    blank = NORMAL_STREAM.index(b"\n\n") + 1  # inside the first blank line
    crlf = NORMAL_STREAM.index(b"\r\n\r\n") + 2  # between the CRLF line end and the blank line
    pieces = split_at(NORMAL_STREAM, [5, blank, blank + 9, crlf, crlf + 1, len(NORMAL_STREAM) - 3])
    async with SplittingEngine(pieces).serving() as engine_url, relayed(hops, engine_url) as url:
        assert await stream_body(url) == NORMAL_STREAM


def framed(pieces: list[bytes]) -> list[bytes]:
    async def source() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    async def collect() -> list[bytes]:
        return [out async for out in whole_events(source())]

    return asyncio.run(collect())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(NORMAL_STREAM)), max_size=12))
def test_whole_events_passes_any_split_on_unchanged_and_each_piece_ends_an_event(cuts: list[int]) -> None:
    out = framed(split_at(NORMAL_STREAM, cuts))
    assert b"".join(out) == NORMAL_STREAM
    passed_on = b""
    for piece in out:
        passed_on += piece
        # where each piece ends, an error event appended by the hop would be parsed on its own
        assert not half_sent_event(passed_on), out


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"])
def test_whole_events_passes_heartbeats_on_at_once_even_after_a_blank_line_read_alone(
    line_end: bytes,
) -> None:
    """A blank line at an event's start ends an event with no field, so it does not hold the next
    heartbeat back: every heartbeat read before a cut reached the client."""
    pieces = [b": ping" + line_end, line_end, b": ping" + line_end, b"data"]

    async def source() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece
        raise ConnectionResetError("cut")

    async def collect() -> bytes:
        out = b""
        with pytest.raises(ConnectionResetError):
            async for piece in whole_events(source()):
                out += piece
        return out

    assert asyncio.run(collect()) == b"".join(pieces[:3])


def test_whole_events_passes_an_unterminated_tail_on_when_the_stream_ends_cleanly() -> None:
    assert framed([FIRST_EVENT, b"data: {}"]) == [FIRST_EVENT, b"data: {}"]


def test_whole_events_drops_a_partial_event_when_the_stream_breaks() -> None:
    async def source() -> AsyncIterator[bytes]:
        yield FIRST_EVENT + PARTIAL_EVENT[:10]
        yield PARTIAL_EVENT[10:]
        raise ConnectionResetError("cut")

    async def collect() -> list[bytes]:
        out: list[bytes] = []
        with pytest.raises(ConnectionResetError):
            async for piece in whole_events(source()):
                out.append(piece)
        return out

    assert asyncio.run(collect()) == [FIRST_EVENT]


def test_whole_events_passes_on_an_event_above_the_bound_unframed() -> None:
    async def source() -> AsyncIterator[bytes]:
        yield b"data: " + b"x" * 50
        yield b"y" * 50

    async def collect() -> list[bytes]:
        return [piece async for piece in whole_events(source(), max_held=80)]

    assert b"".join(asyncio.run(collect())) == b"data: " + b"x" * 50 + b"y" * 50
