"""How the chaos traffic client classifies a request whose connection dies (pure client, stand-in servers).

A stream that has started (200, events read) and then loses its connection with neither ``[DONE]``
nor an SSE error event is a *silently truncated* stream, the very failure ``chaos engine-kill``
reports as "streams cut silently"; it must not hide as a "connection" result that no row of the
printed table shows. A connection that fails before any answer stays a connection error, and the
table counts those too.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from fleet_fixtures import serve_aiohttp

from prefixfleet.chaos.report import phase_table
from prefixfleet.chaos.traffic import Outcome, TrafficPlan, send, tally

PLAN = TrafficPlan(rate_per_s=1.0, duration_s=1.0)


def _app(*, error_event: bool) -> web.Application:
    async def cut_mid_stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"text": "a"}]}\n\n')
        if error_event:
            await resp.write(b'data: {"error": {"message": "upstream gone", "code": 502}}\n\n')
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()  # the process died: no [DONE], no end of the chunked body
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", cut_mid_stream)
    return app


async def _send_one(url: str, *, stream: bool, plan: TrafficPlan = PLAN) -> Outcome:
    outcome = Outcome(index=0, stream=stream, sent_at=0.0)
    async with aiohttp.ClientSession() as session:
        await send(session, [url], plan, 0, outcome)
    return outcome


async def test_a_stream_whose_connection_dies_mid_way_counts_as_cut_silently() -> None:
    async with serve_aiohttp(_app(error_event=False)) as url:
        outcome = await _send_one(url, stream=True)
    assert outcome.result == "stream_truncated", outcome
    assert outcome.latency_s is not None and outcome.ttft_s is not None
    figures = tally([outcome])
    assert figures["streams_truncated_silently"] == 1, figures
    assert figures["connection_errors"] == 0, figures


async def test_a_stream_that_sent_an_error_event_before_its_connection_died_counts_as_a_visible_cut() -> None:
    async with serve_aiohttp(_app(error_event=True)) as url:
        outcome = await _send_one(url, stream=True)
    assert outcome.result == "stream_error_event", outcome
    assert tally([outcome])["streams_cut_with_error_event"] == 1


async def test_a_cut_stream_retried_on_a_working_target_ends_ok() -> None:
    async def whole_stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"text": "a"}]}\n\ndata: [DONE]\n\n')
        await resp.write_eof()
        return resp

    good = web.Application()
    good.router.add_post("/v1/completions", whole_stream)
    retrying = TrafficPlan(rate_per_s=1.0, duration_s=1.0, client_retries=1)
    async with serve_aiohttp(_app(error_event=False)) as bad_url, serve_aiohttp(good) as good_url:
        outcome = Outcome(index=0, stream=True, sent_at=0.0)
        async with aiohttp.ClientSession() as session:
            await send(session, [bad_url, good_url], retrying, 0, outcome)
    assert (outcome.result, outcome.attempts, outcome.gateway) == ("ok", 2, good_url), outcome


async def test_a_refused_connection_is_a_connection_error_and_the_table_shows_it() -> None:
    async with serve_aiohttp(web.Application()) as url:
        pass  # the port is closed again: connections are refused
    stream = await _send_one(url, stream=True)
    plain = await _send_one(url, stream=False)
    assert stream.result == plain.result == "connection"
    figures = tally([stream, plain])
    assert figures["connection_errors"] == 2 and figures["non_streaming_lost"] == 1, figures
    table = phase_table({"overall": figures})
    row = next(line for line in table.splitlines() if line.startswith("connection errors"))
    assert row.split()[-1] == "2", table
