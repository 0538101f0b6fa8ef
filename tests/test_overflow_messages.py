"""A refusal whose number overflowed a float says "too many to count"/"too long", never "inf".

'sim --workload prefixroute --set rate_rps=1e-308' said "spans inf s of arrivals", a viral
duration of 1e308 "would make about inf requests", and a control interval, replay speedup or probe
rate at the float's edge "makes inf control rounds", "would take inf s", "is inf requests". All are
refused before anything starts (load and compare included).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixfleet.cli import main

SIM = ["sim", "--policies", "round_robin", "--no-progress", "--workload"]
COMPARE = ["compare", "--json", "out.json", "--no-progress", "--workload", "prefixroute"]
SCALE = ["sim-autoscale", "--scalers", "uniform", "--no-progress", "--scenario"]


@pytest.mark.parametrize(
    ("argv", "part"),
    [
        ([*SIM, "prefixroute", "--set", "rate_rps=1e-308"], "workload 'prefixroute' spans too long to count"),
        ([*SIM, "gsp", "--set", "rate_rps=1e-308"], "workload 'gsp' spans too long to count"),
        ([*SIM, "chat", "--set", "session_rate_rps=1e-308"], "workload 'chat' spans too long to count"),
        ([*SIM, "viral", "--set", "duration_s=1e308"], "would make too many requests to count; at most"),
        ([*SCALE, "viral", "--set", "rate_rps=1e308"], "would make too many requests to count; at most"),
        ([*SCALE, "diurnal", "--set", "peak_rps=1e308"], "would make too many requests to count; at most"),
        ([*SCALE, "viral", "--control-interval-s", "1e-320"], "makes too many control rounds to count over"),
        (
            ["load", "--target", "http://127.0.0.1:9", "--workload", "prefixroute", "--speedup", "1e-320"],
            "the replay would take too long to count (",
        ),
        (
            [*COMPARE, "--latency-rate", "1e308", "--latency-seconds", "1e308"],
            "--latency-rate × --latency-seconds is too many requests to count per path",
        ),
    ],
)
def test_an_overflowed_number_is_named_in_words(
    argv: list[str],
    part: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # compare's --json out.json, were it ever written
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert part in err, err
    assert "inf" not in err.replace("info", ""), err
    assert err.count("\n") == 1, err
