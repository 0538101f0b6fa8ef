"""`prefixfleet sim`: the JSON and PNG it writes, and one-line errors for bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prefixfleet.cli import main
from prefixfleet.router.policies import DEFAULT_POLICY, POLICIES

REQUIRED = {"mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "hit_rate", "prefill_tokens", "max_replica_share"}


def test_sim_writes_json_of_the_specified_shape_and_a_png(tmp_path: Path, capsys) -> None:
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    argv = [
        "sim",
        "--workload",
        "prefixroute",
        "--set",
        "num_requests=300",
        "--json",
        str(out),
        "--plot",
        str(png),
    ]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "round_robin" in table and "ideal" in table
    data = json.loads(out.read_text())
    assert data["workload"] == "prefixroute"
    assert data["default_policy"] == DEFAULT_POLICY
    assert set(data["policies"]) == {*POLICIES, "ideal"}
    for name, metrics in data["policies"].items():
        assert set(metrics) >= REQUIRED, name
    s = data["settings"]
    assert (s["replicas"], s["cache_tokens"], s["service"]) == (4, 4000, "fifo")
    assert s["workload"]["num_requests"] == 300
    assert "ideal" in s
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_flags_override_the_workloads_acceptance_settings(tmp_path: Path, capsys) -> None:
    out = tmp_path / "r.json"
    argv = [
        "sim", "--workload", "gsp", "--set", "groups=8", "--policies", "round_robin,queue_aware",
        "--replicas", "2", "--cache-tokens", "9000", "--service", "batched", "--engine", "max_running=8",
        "--seed", "3", "--json", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert set(data["policies"]) == {"round_robin", "queue_aware", "ideal"}
    s = data["settings"]
    assert (s["replicas"], s["cache_tokens"], s["service"], s["max_running"], s["seed"]) == (
        2,
        9000,
        "batched",
        8,
        3,
    )


def test_the_emulator_service_model_takes_its_own_parameters(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    argv = [
        "sim", "--workload", "lab-burst", "--policies", "round_robin", "--service", "emulator",
        "--engine", "prefill_pass_s=0.01", "--engine", "summary_interval_s=0.25",
        "--engine", "share_sends=true", "--engine", "share_delay_s=0.007", "--json", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    s = json.loads(out.read_text())["settings"]
    assert (s["service"], s["prefill_pass_s"], s["share_sends"], s["share_delay_s"]) == (
        "emulator",
        0.01,
        True,
        0.007,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workload", "nope"], "unknown workload 'nope'"),
        (["--workload", "gsp", "--policies", "round_robin,bogus"], "unknown policy 'bogus'"),
        (["--workload", "trace:/nonexistent/trace.jsonl"], "trace file not found"),
        (["--workload", "gsp", "--replicas", "0"], "--replicas must be positive"),
        (["--workload", "gsp", "--cache-tokens", "-5"], "--cache-tokens must be positive"),
        (["--workload", "gsp", "--set", "groups"], "must look like KEY=VALUE"),
        (["--workload", "gsp", "--engine", "warp=9"], "unknown --engine parameter 'warp'"),
        (["--workload", "gsp", "--service", "emulator", "--engine", "share_sends=maybe"], "true or false"),
        (["--workload", "gsp", "--engine", "prefill_pass_s=0.01"], "emulator service model only"),
        ([], "--workload is required"),
        (["--workload", "viral", "--set", "duration_s=0.001"], "has no requests"),
    ],
)
def test_bad_arguments_get_one_line_and_exit_2(argv: list[str], message: str, capsys) -> None:
    assert main(["sim", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_malformed_trace_line_is_reported_by_line_number(tmp_path: Path, capsys) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [0]}\n{"timestamp": 1,\n'
    )
    assert main(["sim", "--workload", f"trace:{trace}"]) == 2
    err = capsys.readouterr().err
    assert "line 2: not valid JSON" in err and err.count("\n") == 1


def test_installed_command_exits_2_without_a_traceback() -> None:
    exe = Path(sys.executable).with_name("prefixfleet")
    proc = subprocess.run(
        [str(exe), "sim", "--workload", "trace:/nonexistent.jsonl"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "prefixfleet sim: error: trace file not found: /nonexistent.jsonl"
