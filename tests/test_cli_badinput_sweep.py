"""Bad command-line input is one line naming what is wrong, exit status 2, before any work is done.

Specification, for every command: a value that cannot be used (an output path that cannot be
written, a plot that is not a .png, a number that is not a finite one where a rate or a duration is
expected, a trace that is not UTF-8) is refused with ``prefixfleet COMMAND: error: ...`` naming the
flag or setting, exit 2 and no traceback. Output paths are checked before the run, so a bad
``--json`` never costs a finished run's results. Each case fails before doing the command's work,
so none of them starts a fleet or a simulation.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from fleet_fixtures import popen_interruptible

from prefixfleet.cli import main

pytestmark = pytest.mark.slow

UNDER_A_FILE = f"{__file__}/x"  # a path whose parent is a regular file: never writable, even as root
TRACE = Path(__file__).resolve().parents[1] / "traces" / "mooncake_synthetic_trace.jsonl"  # bench policies
SIM = ["sim", "--workload", "prefixroute", "--set", "num_requests=20", "--policies", "round_robin"]
SCALE = ["sim-autoscale", "--scenario", "viral", "--set", "duration_s=20", "--scalers", "uniform"]
LOAD = ["load", "--target", "http://127.0.0.1:9", "--workload", "prefixroute", "--set", "num_requests=2"]
COMPARE = ["compare", "--workload", "prefixroute", "--json", "c.json"]

OUTPUT_CASES = [
    # (argv, what the one line must say); a directory named "adir" exists in the working directory
    ([*SIM, "--json", f"{UNDER_A_FILE}.json"], "--json: "),
    ([*SIM, "--json", "adir"], "--json adir is a directory"),
    ([*SIM, "--json", ""], "--json is empty"),
    ([*SIM, "--plot", "out.txt"], "--plot must name a .png file, got 'out.txt'"),
    ([*SIM, "--plot", "out"], "--plot must name a .png file"),
    (["sim", "--reproduce", "lab", "--json", f"{UNDER_A_FILE}.json"], "--json: "),
    ([*SCALE, "--json", ""], "--json is empty"),
    ([*SCALE, "--plot", "a.svg"], "--plot must name a .png file"),
    (["bench", "tree", "--quiet", "--json", "adir"], "--json adir is a directory"),
    (["bench", "policies", "--quiet", "--json", "adir"], "--json adir is a directory"),
    (["emulator-bench", "--requests", "2", "--json", f"{UNDER_A_FILE}.json"], "--json: "),
    ([*LOAD, "--json", "adir"], "--json adir is a directory"),
    (["up", "--json", ""], "--json is empty"),
    (["up", "--plot", "up.txt"], "--plot must name a .png file"),
    (["up", "--run-dir", UNDER_A_FILE], "--run-dir: "),
    ([*COMPARE, "--json", "adir"], "--json adir is a directory"),
    ([*COMPARE, "--plot", "c.jpg"], "--plot must name a .png file"),
    ([*COMPARE, "--run-dir", UNDER_A_FILE], "--run-dir: "),
    (["chaos", "engine-kill", "--json", f"{UNDER_A_FILE}.json"], "--json: "),
    (["chaos", "soak", "--run-dir", __file__], "--run-dir"),
    (["chaos", "all", "--json-dir", UNDER_A_FILE], "--json-dir: "),
    (["report", "--prometheus", "http://127.0.0.1:9", "--out", __file__], "--out"),
]

SETTING_CASES = [
    # workload and scenario settings (--set KEY=VALUE), one rule for every workload
    ([*SCALE, "--set", "duration_s=inf"], "setting 'duration_s' must be a finite number, got 'inf'"),
    ([*LOAD, "--set", "rate_rps=inf"], "setting 'rate_rps' must be a finite number"),
    ([*SIM, "--set", "output_tokens=-1"], "setting 'output_tokens' must be >= 0, got '-1'"),
    ([*SCALE, "--set", "ramp_s=-5"], "setting 'ramp_s' must be >= 0"),
    ([*SIM, "--set", "turn_tokens_max=3"], "'turn_tokens_min' (50) must be <= 'turn_tokens_max' ('3')"),
    ([*SIM, "--set", "zipf_exponent=1e9"], "'zipf_exponent' '1e9' is too far from 0"),
    ([*SIM, "--set", "prefix_tokens_max=100000000000"], "'prefix_tokens_max' must be at most 10,000,000"),
    ([*SCALE, "--control-interval-s", "1e-300"], "--control-interval-s 1e-300 makes 1.99e+301 control"),
    (["sim", "--workload", "trace:binary.jsonl"], "trace binary.jsonl line 2: not UTF-8 text"),
    (["up", "--workload", "trace:binary.jsonl"], "trace binary.jsonl line 2: not UTF-8 text"),
    # finite values that never finished: a generator looping for ever, arrivals so far apart that every
    # TTFT read 0, a trace sped up into infinite arrival times (a traceback), a replay lasting aeons
    ([*SIM, "--set", "rate_rps=1e-300"], "'prefixroute' spans 1.73e+301 s of arrivals"),
    (["sim", "--workload", "viral", "--set", "duration_s=1e300"], "would make about 7.5e+301 requests"),
    (["sim", "--workload", "viral", "--set", "surge=1e300"], "at most 10,000,000"),
    (["sim", "--workload", "trace:far.jsonl", "--set", "speedup=1e-30"], "spans too long to count"),
    ([*SCALE, "--set", "surge=1e300"], "scenario 'viral': 'rate_rps' × 'surge' × 'duration_s' would make"),
    (["load", "--target", "http://h:9", "--workload", "trace:far.jsonl"], "spans 1e+297 s of arrivals"),
    ([*LOAD, "--speedup", "1e-300"], "s of arrivals at --speedup 1e-300); at most 604,800 s (7 days)"),
    # (a --time-scale below the emulator's 0.001 is refused before: a slow workload at 0.001 instead)
    (["up", "--requests", "50", "--set", "rate_rps=0.001", "--time-scale", "0.001"], "at most 604,800 s"),
    ([*COMPARE, "--requests", "50", "--set", "rate_rps=0.001", "--time-scale", "0.001"], "at most 604,800 s"),
]

NUMBER_CASES = [
    ([*COMPARE, "--latency-rate", "1e300"], "--latency-rate × --latency-seconds is 5e+300 requests"),
    (["bench", "policies", "--json", str(TRACE)], "is the input"),
    (["sim", "--workload", "trace:t.jsonl", "--json", "t.jsonl"], "--json t.jsonl is the input t.jsonl"),
    (["load", "--target", "http://h:9", "--workload", "trace:t.jsonl", "--json", "./t.jsonl"], "the input"),
    (["compare", "--trace", "t.jsonl", "--json", "t.jsonl"], "--json t.jsonl is the input t.jsonl"),
    ([*COMPARE, "--block-tokens", "32"], "--block-tokens applies to traces only"),
    (["up", "--max-replicas", "8"], "--max-replicas needs --autoscale"),
    (["sim", "--reproduce", "lab", "--plot", "lab.png"], "runs the published settings; drop --plot"),
    (["sim", "--reproduce", "lab", "--set", "x=1", "--seed", "3"], "drop --seed, --set"),
    # a flag given with its default's value is still given: refused as any other value would be
    (["up", "--min-replicas", "1"], "--min-replicas needs --autoscale"),
    (["up", "--autoscale-interval", "2"], "--autoscale-interval needs --autoscale"),
    ([*COMPARE, "--block-tokens", "16"], "--block-tokens applies to traces only"),
    (["sim", "--reproduce", "lab", "--policies", "all", "--seed", "0"], "drop --policies, --seed"),
    (["load", "--target", "http://", "--workload", "chat"], "--target 'http://' names no host"),
    (["load", "--target", "http://[::1", "--workload", "chat"], "opens a [ it does not close"),
    (["load", "--target", "http://127.0.0.1:99999", "--workload", "chat"], "not a number in 1..65535"),
    ([*LOAD, "--model", ""], "--model is empty"),
    (["up", "--requests", "5", "--cache-tokens", "2"], "--cache-tokens 2 cannot hold the workload's longest"),
    ([*COMPARE, "--requests", "5", "--cache-tokens", "100"], "--cache-tokens 100 cannot hold"),
    (["compare", "--json", "c.json", "--trace", "adir"], "--trace adir: is a directory, not a trace file"),
    (["emulator", "--port", "0", "--host", ""], "--host is empty"),
    (
        ["emulator", "--port", "0", "--decode-tokens-per-s", "inf"],
        "--decode-tokens-per-s must be positive, got inf",
    ),
    ([*SIM, "--engine", "prefill_s_per_token=nan"], "--engine prefill_s_per_token must be a finite number"),
    ([*SCALE, "--engine", "decode_base_s=inf"], "--engine decode_base_s must be a finite number"),
    ([*SIM, "--engine", "max_running=1e400"], "--engine max_running is too large, got '1e400'"),
    (["chaos", "engine-kill", "--time-scale", "nan"], "--time-scale must be positive, got nan"),
    (["chaos", "engine-kill", "--time-scale", "inf"], "--time-scale must be positive, got inf"),
    (["chaos", "redis-outage", "--outage", "nan"], "--outage must be positive, got nan"),
    (["chaos", "engine-kill", "--rate", "1e300"], "--rate × --duration is 2e+301 requests; at most"),
    (["chaos", "soak", "--policy", ""], "unknown --policy ''"),
    (["emulator-bench", "--concurrency", "0"], "--concurrency must be at least 1, got 0"),
    (["emulator-bench", "--max-new-tokens", "-1"], "--max-new-tokens must be at least 0, got -1"),
]


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    words = argv[:2] if argv[0] in ("bench", "chaos", "router", "operator") else argv[:1]
    assert lines[0].startswith(f"prefixfleet {' '.join(words)}: error: ")
    return lines[0]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "adir").mkdir()
    (tmp_path / "binary.jsonl").write_bytes(b"\n\xff\xfe\n")  # line 1 blank, line 2 not UTF-8
    trace = '{"timestamp": 0, "input_length": 8, "output_length": 1, "hash_ids": [1]}\n'
    (tmp_path / "t.jsonl").write_text(trace)
    (tmp_path / "far.jsonl").write_text(trace + trace.replace('"timestamp": 0', '"timestamp": 1e300'))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("argv", "message"), OUTPUT_CASES + SETTING_CASES + NUMBER_CASES, ids=lambda v: " ".join(v)[-60:]
)
def test_a_bad_value_is_one_line_naming_it_before_any_work(
    argv: list[str], message: str, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in _refused(argv, capsys)
    assert sorted(p.name for p in workdir.iterdir()) == ["adir", "binary.jsonl", "far.jsonl", "t.jsonl"]
    assert (workdir / "t.jsonl").read_text().startswith('{"timestamp": 0')


def test_a_json_in_a_missing_directory_is_written_there(workdir: Path) -> None:
    """Missing parent directories are made, as `mkdir -p` would; the run's results are not lost."""
    assert main([*SIM, "--no-progress", "--json", "new/deeper/r.json"]) == 0
    assert (workdir / "new" / "deeper" / "r.json").read_text().startswith("{")


def test_a_run_where_nothing_succeeded_writes_strict_json(workdir: Path) -> None:
    """Means over no successful request are null in --json, not NaN (which no strict parser reads)."""
    with socket.socket() as s:  # a port nothing listens on: every request is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["load", "--target", f"http://127.0.0.1:{port}", "--workload", "prefixroute"]
    assert main([*argv, "--set", "num_requests=3", "--no-progress", "--json", "l.json"]) == 1  # all failed

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} in the JSON")

    summary = json.loads((workdir / "l.json").read_text(), parse_constant=refuse)
    assert summary["errors"] == 3 and summary["mean_ttft_ms"] is None


def test_keep_running_writes_its_results_before_holding_the_fleet(tmp_path: Path) -> None:
    """`up --keep-running` ends only by Ctrl-C: --json and --plot are written before the hold, not
    after it (they were lost: the interrupt never returned the report to the command)."""
    out, png = tmp_path / "up.json", tmp_path / "up.png"
    argv = [
        sys.executable, "-m", "prefixfleet.cli", "up", "--requests", "6", "--replicas", "1",
        "--gateways", "1", "--time-scale", "8", "--policies", "round_robin", "--no-sim-check",
        "--no-progress", "--keep-running", "--run-dir", str(tmp_path / "run"),
        "--json", str(out), "--plot", str(png),
    ]  # fmt: skip
    proc = popen_interruptible(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = ""
        for _ in range(200):  # bounded: the banner comes after the benchmark
            line = proc.stdout.readline()
            if not line or "fleet running" in line:
                break
        assert "fleet running" in line, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert json.loads(out.read_text())["policies"]["round_robin"]["requests"] == 6
    assert png.read_bytes().startswith(b"\x89PNG")
