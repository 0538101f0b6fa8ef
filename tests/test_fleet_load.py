"""The load generator against a real emulator process: counts, cached tokens and errors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from prefixfleet.fleet.load import LoadRequest, percentile, requests_from_workload, run_load, summarize
from prefixfleet.fleet.local import EngineSettings, emulator_argv
from prefixfleet.fleet.processes import Supervisor
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.sim.workloads import Workload, WorkloadRequest

PREFIX = list(range(1000, 1100))  # 100 shared tokens


def shared_prefix_workload() -> Workload:
    """A, then B sharing A's 100-token prefix, then A again: cached 0, 100, all of A."""
    a = PREFIX + list(range(5000, 5020))
    b = PREFIX + list(range(6000, 6030))
    reqs = [
        WorkloadRequest(0.0, as_token_bytes(a), 3, "t0"),
        WorkloadRequest(0.3, as_token_bytes(b), 3, "t0"),
        WorkloadRequest(0.6, as_token_bytes(a), 3, "t0"),
    ]
    return Workload("shared-prefix", reqs)


@pytest.fixture
async def engine_url(tmp_path: Path) -> AsyncIterator[str]:
    async with Supervisor(tmp_path) as sup:
        port = sup.allocate_port()
        url = f"http://127.0.0.1:{port}"
        settings = EngineSettings(cache_tokens=4000, max_running=8, time_scale=20.0)
        await sup.start("engine", emulator_argv(port, settings), health_url=f"{url}/health")
        yield url


@pytest.mark.parametrize(("api", "stream"), [("openai", True), ("sglang", True), ("sglang", False)])
async def test_counts_and_cached_tokens_come_from_the_engine(engine_url: str, api: str, stream: bool) -> None:
    requests = requests_from_workload(shared_prefix_workload())
    assert [r.prompt_tokens for r in requests] == [120, 130, 120]
    run = await run_load(requests, [engine_url], api=api, stream=stream, speedup=3.0, progress=False)  # type: ignore[arg-type]
    by_index = sorted(run.outcomes, key=lambda o: o.index)
    assert [o.ok for o in by_index] == [True, True, True]
    assert [o.prompt_tokens for o in by_index] == [120, 130, 120]
    assert by_index[0].cached_tokens == 0
    assert by_index[1].cached_tokens == 100
    assert by_index[2].cached_tokens >= 100
    summary = run.summary
    assert (summary.requests, summary.completed, summary.errors) == (3, 3, 0)
    assert summary.hit_rate == pytest.approx(sum(o.cached_tokens for o in by_index) / 370)
    assert all(o.ttft_s is not None and o.ttft_s > 0 for o in by_index)


async def test_refused_connections_are_counted_not_raised(tmp_path: Path) -> None:
    async with Supervisor(tmp_path) as sup:
        dead = f"http://127.0.0.1:{sup.allocate_port()}"  # nothing listens here
    requests = [LoadRequest(0.01 * i, "hello world", 2, 4) for i in range(5)]
    run = await run_load(requests, [dead], progress=False, timeout_s=5)
    summary = run.summary
    assert (summary.requests, summary.completed, summary.errors) == (5, 0, 5)
    assert summary.error_kinds == {"connection": 5}


async def test_rejected_requests_are_counted_by_status(engine_url: str) -> None:
    too_long = LoadRequest(0.0, " ".join(["w"] * 5000), 5000, 4)  # longer than the 4000-token KV pool
    ok = LoadRequest(0.05, "a short prompt", 3, 2)
    run = await run_load([too_long, ok], [engine_url], progress=False)
    summary = run.summary
    assert (summary.completed, summary.errors) == (1, 1)
    assert list(summary.error_kinds) == ["http_400"]


def test_percentiles_interpolate_like_numpy() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([5.0], 0.99) == 5.0
    assert summarize([], 1.0).completed == 0


def test_load_command_writes_its_summary(tmp_path: Path, capsys) -> None:
    import json
    import subprocess

    from fleet_fixtures import free_port, wait_for_http

    from prefixfleet.cli import main

    port = free_port()
    argv = emulator_argv(port, EngineSettings(time_scale=20))
    engine = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # bounded (30 s) and failing here if it never answers: a 100 x 0.1 s loop fell through to the
        # load after 10 s, which a loaded machine's interpreter start-up can take
        wait_for_http(f"http://127.0.0.1:{port}/health", proc=engine)
        out = tmp_path / "load.json"
        status = main(
            ["load", "--target", f"http://127.0.0.1:{port}", "--workload", "lab-burst", "--limit", "6",
             "--speedup", "4", "--json", str(out), "--no-progress"]
        )  # fmt: skip
    finally:
        engine.terminate()
        engine.wait(timeout=10)
    assert status == 0
    summary = json.loads(out.read_text())
    assert (summary["requests"], summary["completed"], summary["errors"]) == (6, 6, 0)
    assert 0.0 < summary["hit_rate"] < 1.0  # the lab's tenants repeat their 4096-token prefixes
    assert "lab-burst" in capsys.readouterr().out
