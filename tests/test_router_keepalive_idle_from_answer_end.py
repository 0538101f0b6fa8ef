"""A pooled upstream connection's idle time counts from the end of its last answer, not from when the
hop gave the connection back.

Specification: a server closes a keep-alive connection its ``Keep-Alive: timeout=N`` after it ended
its last answer; the upstream pool retires one idle for N less KEEP_ALIVE_MARGIN_S (1 s), so that no
request is written to a connection being closed. A hop gives a connection back only when it is done
with the exchange: after relaying the whole answer to its own client, which a slow client (or a busy
loop) may hold up for seconds after the upstream's last byte. Before, the pool counted the idle time
from that release, so a relay lag over the 1 s margin let the pool reuse a connection the server was
already closing (a request lost, below STALE_AFTER_IDLE_S not re-sent). Now it counts from the
answer's last byte, as the server does; the idle time the stale-connection rule reads is that one too.

The pool's clock is a fake (router/upstream.py reads ``time.monotonic`` only for this), so no step
waits on real time.
"""

from __future__ import annotations

import types

import pytest
from test_keepalive_idle_limit import _hinting_server, _pooled

from prefixfleet.router import upstream
from prefixfleet.router.upstream import KEEP_ALIVE_MARGIN_S, UpstreamPool

pytestmark = pytest.mark.timeout(60)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(upstream, "time", types.SimpleNamespace(monotonic=fake.monotonic))
    return fake


async def test_the_idle_time_runs_from_the_answers_end_not_from_the_release(clock: FakeClock) -> None:
    pool = UpstreamPool(idle_timeout_s=15.0)
    hint_s = 3.0
    async with _hinting_server(f"timeout={hint_s:g}") as (origin, served_on):
        async with await pool.send(origin, "POST", "/x", [], b"{}") as exchange:
            response = await exchange.response()
            assert await response.read() == b"ok"  # the server's idle clock starts about now
            clock.now += 1.5  # the hop relays the answer to a slow client before giving it back
        [conn] = _pooled(pool, origin)
        assert conn.retire_at == pytest.approx(1000.0 + hint_s - KEEP_ALIVE_MARGIN_S)
        clock.now += 0.6  # 2.1 s after the answer ended: past 3 - 1 s, so not reused
        async with await pool.send(origin, "POST", "/x", [], b"{}") as exchange:
            await (await exchange.response()).read()
        assert served_on == [1, 2]
    pool.close()


async def test_a_connection_reused_within_the_limit_reports_its_idle_time_since_the_answer(
    clock: FakeClock,
) -> None:
    pool = UpstreamPool(idle_timeout_s=15.0)
    async with _hinting_server("timeout=10") as (origin, served_on):
        async with await pool.send(origin, "POST", "/x", [], b"{}") as exchange:
            await (await exchange.response()).read()
            clock.now += 1.5
        clock.now += 1.0
        conn, idle_s = await pool._acquire(origin)
        assert idle_s == pytest.approx(2.5)  # what the stale rule reads: the server's idle time
        conn.abort()
    assert served_on == [1]
    pool.close()
