"""A local fleet of vLLM-API engines (`prefixfleet up --engine-api vllm`), driven as a user drives it.

Real processes: Valkey, `prefixfleet emulator --api vllm --enable-prompt-tokens-details` engines
(with VLLM_SERVER_DEV_MODE=1), `router sidecar --engine-api vllm`, a gateway. Specification:
* the engines speak vLLM's API only (``/v1/models``; no SGLang ``/get_server_info``), and each
  sidecar says it speaks vLLM's;
* OpenAI requests through the gateway are answered with vLLM's usage: a repeated prefix is a cache
  hit (``usage.prompt_tokens_details.cached_tokens`` > 0, whole 16-token blocks, below the prompt's
  length), and the gateway sends each repeated prefix to the replica that holds it;
* the fleet's reset between policies (a flush through each sidecar, which vLLM serves as
  ``/reset_prefix_cache`` in dev mode) empties the engines' caches: the same prompt is a miss after;
* ``prefixfleet up --engine-api vllm`` runs its policies end to end (a reset between them) with hits
  and no errors;
* the autoscaler scales a vLLM fleet up with a pre-warmed replica (pre-warm through the sidecar's
  vLLM path, ``/v1/completions`` with token ids): the new replica's first requests are hits on
  the whole prefix.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fleet_fixtures import eventually

from prefixfleet.cli import main
from prefixfleet.fleet.autoscale import LocalAutoscaler
from prefixfleet.fleet.local import VLLM_BLOCK_TOKENS, EngineSettings, FleetSpec, LocalFleet
from prefixfleet.fleet.processes import Supervisor
from prefixfleet.operator.autoscale import ScalePolicy
from prefixfleet.router.proxying import WORKER_HEADER
from prefixfleet.tokenizer import tokenize

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

ENGINE = EngineSettings(cache_tokens=60_000, prefill_tokens_per_s=4000, api="vllm")
PREFIXES = {
    name: f"You are the {name} assistant of the vLLM fleet test; answer from the {name} handbook. " * 30
    for name in ("billing", "shipping")
}


def full_blocks(text: str) -> int:
    """Tokens of ``text`` in whole vLLM blocks: what a hit on it as a prefix reports at least."""
    return len(tokenize(text)) // VLLM_BLOCK_TOKENS * VLLM_BLOCK_TOKENS


async def complete(http: httpx.AsyncClient, url: str, prompt: str) -> tuple[str, int, int]:
    """(worker, prompt_tokens, cached_tokens) of one /v1/completions request through ``url``."""
    resp = await http.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 1})
    assert resp.status_code == 200, resp.text
    usage = resp.json()["usage"]
    details = usage.get("prompt_tokens_details") or {}
    return resp.headers.get(WORKER_HEADER, ""), usage["prompt_tokens"], details.get("cached_tokens") or 0


@pytest.fixture
async def vllm_fleet(tmp_path: Path) -> AsyncIterator[LocalFleet]:
    async with Supervisor(tmp_path) as sup:
        fleet = LocalFleet(sup, FleetSpec(replicas=2, gateways=1, engine=ENGINE))
        await fleet.start_engines()
        await fleet.start_gateways("queue_aware")
        yield fleet


async def test_requests_through_the_gateway_hit_the_replica_holding_their_prefix(
    vllm_fleet: LocalFleet,
) -> None:
    fleet = vllm_fleet
    gateway = fleet.gateway_urls[0]
    async with httpx.AsyncClient(timeout=60) as http:
        for replica in fleet.replicas:
            assert (await http.get(f"{replica.engine_url}/v1/models")).status_code == 200
            assert (await http.get(f"{replica.engine_url}/get_server_info")).status_code == 404
            status = (await http.get(f"{replica.sidecar_url}/prefixfleet/status")).json()
            assert status["engine_api"] == "vllm", status

        holders = {}
        for name, prefix in PREFIXES.items():
            worker, _, cached = await complete(http, gateway, prefix + f"first {name} question")
            assert worker and cached == 0, (name, worker, cached)
            holders[name] = worker
        for round_ in range(3):
            for name, prefix in PREFIXES.items():
                worker, prompt_tokens, cached = await complete(http, gateway, prefix + f"question {round_}")
                assert worker == holders[name], (name, round_, worker, holders)
                assert full_blocks(prefix) <= cached < prompt_tokens, (name, cached)
                assert cached % VLLM_BLOCK_TOKENS == 0, cached

        # the reset `up` does between policies: a flush through every sidecar (vLLM's
        # /reset_prefix_cache, served in dev mode); each holder's engine then misses its prefix
        await fleet.reset()
        sidecars = {r.worker_id: r.sidecar_url for r in fleet.replicas}
        for name, prefix in PREFIXES.items():
            _, _, cached = await complete(http, str(sidecars[holders[name]]), prefix + "question 0")
            assert cached == 0, name


def test_up_with_vllm_engines_runs_its_policies_with_hits_and_no_errors(tmp_path: Path) -> None:
    out_json = tmp_path / "up.json"
    flags = {
        "--engine-api": "vllm",
        "--requests": "40",
        "--replicas": "2",
        "--gateways": "1",
        "--time-scale": "4",
        "--policies": "default,round_robin",
        "--json": str(out_json),
        "--run-dir": str(tmp_path / "run"),
    }
    argv = ["up", *(word for pair in flags.items() for word in pair), "--no-sim-check", "--no-progress"]
    assert main(argv) == 0
    report = json.loads(out_json.read_text())
    engine = report["settings"]["engine"]
    assert engine["api"] == "vllm" and engine["cache_tokens"] % VLLM_BLOCK_TOKENS == 0
    for policy, row in report["policies"].items():
        assert row["errors"] == 0 and row["requests"] == 40, (policy, row)
        assert 0.0 < row["hit_rate"] < 1.0, (policy, row)  # shared prefixes hit; last tokens never do


PREWARM_POLICY = ScalePolicy(
    min_replicas=1, max_replicas=2, target_ttft_s=1.0, scale_up_cooldown_s=0, scale_down_stabilization_s=3,
    hot_rate_rps=0.2, prewarm_subtrees=2, target_load=0.5, scale_down_load=0.2, lead_time_s=0,
)  # fmt: skip
HOT = "You are the support agent of the vLLM autoscaling tenant; follow the handbook closely. " * 60


async def burst(gateway: str, clients: int, stop: asyncio.Event, answers: list[tuple[str, int]]) -> None:
    async def client(c: int) -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            i = 0
            while not stop.is_set():
                tail = " ".join(f"c{c}x{i}w{j}" for j in range(60))
                worker, _, cached = await complete(http, gateway, HOT + tail)
                answers.append((worker, cached))
                i += 1

    await asyncio.gather(*(client(c) for c in range(clients)))


def prompt_rate(autoscaler: LocalAutoscaler, replica: str) -> float:
    """The prompt tokens per second the autoscaler last read from ``replica``'s engine (0: none)."""
    rates = autoscaler.engines.rates if autoscaler.engines is not None else {}
    return rates[replica].prompt_tokens_per_s if replica in rates else 0.0


async def test_the_autoscaler_adds_a_prewarmed_vllm_replica(tmp_path: Path) -> None:
    async with Supervisor(tmp_path) as sup:
        fleet = LocalFleet(sup, FleetSpec(replicas=1, gateways=1, engine=ENGINE))
        await fleet.start_engines()
        await fleet.start_gateways("queue_aware")
        autoscaler = LocalAutoscaler(fleet, PREWARM_POLICY, interval_s=1.0)
        stop_scaler, stop_burst = asyncio.Event(), asyncio.Event()
        scaler = asyncio.create_task(autoscaler.run(stop_scaler))
        answers: list[tuple[str, int]] = []
        load = asyncio.create_task(burst(fleet.gateway_urls[0], 4, stop_burst, answers))
        events = lambda: list(autoscaler.events)  # noqa: E731
        try:
            await eventually(lambda: any(e.action == "prewarm" for e in events()), 60, "a pre-warm")
            # the autoscaler reads vLLM's series (vllm:prefix_cache_queries_total, ...) from the sidecars
            await eventually(
                lambda: prompt_rate(autoscaler, "replica-0") > 0, 30, "replica-0's prompt-token rate"
            )
            await eventually(
                lambda: sum(1 for w, _ in answers if w == "replica-1") >= 3, 60, "requests on the new replica"
            )
        finally:
            stop_burst.set()
            await load
            stop_scaler.set()
            await scaler
        warm = next(e for e in events() if e.action == "prewarm")
        assert warm.detail.startswith("replica-1:") and warm.detail.endswith(" 0 failed"), warm.detail
        on_new = [cached for worker, cached in answers if worker == "replica-1"]
        assert all(c >= full_blocks(HOT) - VLLM_BLOCK_TOKENS for c in on_new[:3]), (
            on_new[:10],
            full_blocks(HOT),
        )
