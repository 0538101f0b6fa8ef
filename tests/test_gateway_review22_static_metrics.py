"""A gateway routing over static ``--worker``s (no Redis) reports its workers on /metrics.

``prefixfleet_gateway_workers{status}``, ``..._worker_in_flight{worker}`` and the overlay pruning
were updated only after a Redis refresh, so a gateway without Redis (docs/gateway.md: "Without
Redis, a gateway can route over a static list") had no ``prefixfleet_gateway_workers`` series at
all, whatever its workers' health: a dashboard or an alert on routable workers saw nothing (or
"no data") for it. Now the health checks of static workers update the same figures.
"""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import eventually, serve_aiohttp
from prometheus_client.parser import text_string_to_metric_families

from prefixfleet.router.gateway import GatewayConfig, listening

pytestmark = pytest.mark.timeout(60)
WAIT_S = 30.0


def _worker(status: int) -> web.Application:
    async def health(_request: web.Request) -> web.Response:
        return web.Response(status=status)

    app = web.Application()
    app.router.add_get("/health", health)
    return app


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


async def test_a_static_gateway_reports_routable_and_unroutable_workers_on_metrics() -> None:
    async with (
        serve_aiohttp(_worker(200)) as up,
        serve_aiohttp(_worker(503)) as down,
        listening(GatewayConfig(port=0, workers=(up, down), health_interval_s=0.05)) as served,
        aiohttp.ClientSession() as http,
    ):
        url = f"http://127.0.0.1:{served.port}/metrics"

        async def workers() -> dict[tuple[tuple[str, str], ...], float]:
            async with http.get(url) as resp:
                return _samples(await resp.text(), "prefixfleet_gateway_workers")

        want = {(("status", "routable"),): 1.0, (("status", "unroutable"),): 1.0}
        await eventually(workers, WAIT_S, "the static workers on /metrics", done=lambda got: got == want)

        async def in_flight() -> dict[tuple[tuple[str, str], ...], float]:
            async with http.get(url) as resp:
                return _samples(await resp.text(), "prefixfleet_gateway_worker_in_flight")

        both = {(("worker", up),): 0.0, (("worker", down),): 0.0}
        await eventually(
            in_flight, WAIT_S, "each static worker's in-flight gauge", done=lambda got: got == both
        )
