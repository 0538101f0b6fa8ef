"""`prefixfleet up --engine-api sglang|vllm`: what each replica's processes are started with.

Specification (the live fleet itself: tests/test_fleet_vllm_e2e.py):
* ``sglang`` (the default) is the fleet as before: emulators with ``--enable-cache-report``,
  sidecars with ``--engine-api sglang``, nothing added to the engines' environment;
* ``vllm``: emulators with ``--api vllm --enable-prompt-tokens-details`` and VLLM_SERVER_DEV_MODE=1
  in their environment (the flush between policies is vLLM's dev-mode /reset_prefix_cache), sidecars
  with ``--engine-api vllm``; each command line is parsed by the real ``prefixfleet`` parser;
* vLLM's KV pool is whole 16-token blocks: a cache size derived from the workload is rounded up to
  one, a given ``--cache-tokens`` that is not one is refused in one line before anything starts;
* the local autoscaler reads the engines' own series: vLLM's names for a vLLM fleet;
* the report's title says when the engines spoke vLLM's API.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest

from prefixfleet.cli import build_parser, main
from prefixfleet.fleet.autoscale import LocalAutoscaler
from prefixfleet.fleet.cli import format_up
from prefixfleet.fleet.local import (
    VLLM_BLOCK_TOKENS,
    EngineSettings,
    FleetSpec,
    LocalFleet,
    emulator_argv,
    emulator_env,
    engine_for_workload,
    sidecar_argv,
)
from prefixfleet.fleet.sampling import build_scaled_workload
from prefixfleet.operator.autoscale import ScalePolicy
from prefixfleet.operator.autoscale_observe import SGLANG_METRICS, VLLM_METRICS

CHILD = ["-m", "prefixfleet.fleet.child"]


def parsed(argv: list[str]) -> argparse.Namespace:
    """A child's argv (``python -m prefixfleet.fleet.child ARGS``) as `prefixfleet ARGS` parses it."""
    assert argv[1:3] == CHILD, argv
    return build_parser().parse_args(argv[3:])


def sidecar(api: str) -> list[str]:
    return sidecar_argv(
        8101, "http://127.0.0.1:8100", "redis://127.0.0.1:6379/0", "replica-0", "local", None, api
    )


def test_sglang_engines_are_the_fleet_as_before() -> None:
    engine = EngineSettings(cache_tokens=4000)
    emulator = emulator_argv(8100, engine)
    assert "--enable-cache-report" in emulator and "--api" not in emulator
    assert parsed(emulator).api == "sglang"
    assert emulator_env(engine) is None
    assert parsed(sidecar("sglang")).engine_api == "sglang"


def test_vllm_engines_speak_vllms_api_in_dev_mode_behind_vllm_sidecars() -> None:
    engine = EngineSettings(cache_tokens=4000, api="vllm")
    emulator = emulator_argv(8100, engine)
    args = parsed(emulator)
    assert args.api == "vllm" and args.enable_prompt_tokens_details is True
    assert "--enable-cache-report" not in emulator  # SGLang's flag: the emulator refuses it with --api vllm
    assert emulator_env(engine) == {"VLLM_SERVER_DEV_MODE": "1"}
    assert parsed(sidecar("vllm")).engine_api == "vllm"


def test_a_derived_cache_is_whole_vllm_blocks_and_holds_what_sglangs_does() -> None:
    workload = build_scaled_workload("prefixroute", 200, seed=0)
    sglang = engine_for_workload(workload, 4, time_scale=1.0)
    vllm = engine_for_workload(workload, 4, time_scale=1.0, api="vllm")
    assert vllm.api == "vllm" and vllm.cache_tokens is not None and sglang.cache_tokens is not None
    assert vllm.cache_tokens % VLLM_BLOCK_TOKENS == 0
    assert sglang.cache_tokens <= vllm.cache_tokens < sglang.cache_tokens + VLLM_BLOCK_TOKENS
    assert FleetSpec(engine=vllm).problems() == []


def test_a_given_cache_that_is_not_whole_vllm_blocks_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["up", "--engine-api", "vllm", "--cache-tokens", "100001", "--run-dir", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--cache-tokens must be a multiple of vLLM's block size 16" in err and "100001" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_an_unknown_engine_api_is_refused() -> None:
    assert FleetSpec(engine=EngineSettings(api="tgi")).problems() == [
        "--engine-api must be one of sglang, vllm, got 'tgi'"
    ]
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["up", "--engine-api", "tgi"])
    assert exc.value.code == 2


@pytest.mark.parametrize(("api", "names"), [("sglang", SGLANG_METRICS), ("vllm", VLLM_METRICS)])
def test_the_local_autoscaler_reads_the_engines_own_series(api: str, names: object) -> None:
    spec = FleetSpec(replicas=1, engine=replace(EngineSettings(cache_tokens=4000), api=api))
    fleet = LocalFleet(None, spec)  # type: ignore[arg-type]  # nothing is started: no supervisor needed
    scaler = LocalAutoscaler(fleet, ScalePolicy(min_replicas=1, max_replicas=2))
    assert scaler.prometheus_scope().metrics == names


def test_the_reports_title_names_vllm_engines() -> None:
    settings = {"requests": 40, "replicas": 2, "gateways": 1}
    for api, engines in (("vllm", "2 vLLM-API engines"), ("sglang", "2 engines")):
        engine = {"cache_tokens": 4096, "time_scale": 4.0, "api": api}
        report = {"workload": "prefixroute", "settings": {**settings, "engine": engine}, "policies": {}}
        title = format_up(report).splitlines()[0]
        assert title.startswith(f"prefixroute: 40 requests, {engines} × 4096 cache tokens"), title
