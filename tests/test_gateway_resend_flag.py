"""`prefixfleet router gateway --max-resends-after-receipt N` sets how often a request a worker received
before failing is re-sent (the query-of-death guard, tests/test_failover_query_of_death.py); before,
only `GatewayConfig` had it and a deployed gateway could not turn it off."""

from __future__ import annotations

import pytest

import prefixfleet.router.gateway as gateway_module
from prefixfleet.cli import main
from prefixfleet.router.gateway import GatewayConfig

GATEWAY = ["router", "gateway", "--port", "18080", "--worker", "http://127.0.0.1:9"]


@pytest.mark.parametrize(
    ("argv", "resends", "retries"),
    [([], 1, 3), (["--max-resends-after-receipt", "0", "--max-retries", "5"], 0, 5)],
)
def test_the_flags_reach_the_gateway_config(
    argv: list[str], resends: int, retries: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[GatewayConfig] = []

    async def serve(config: GatewayConfig) -> None:
        seen.append(config)

    monkeypatch.setattr(gateway_module, "serve", serve)
    assert main([*GATEWAY, *argv]) == 0
    (config,) = seen
    assert (config.resends_after_receipt, config.max_retries) == (resends, retries)
    # the flags' defaults are the config's own
    assert GatewayConfig(port=0).resends_after_receipt == 1 and GatewayConfig(port=0).max_retries == 3
