"""`prefixfleet load` fails (exit status 1) when any request failed: a script checking an endpoint
(a wrong --target port, a fleet answering 5xx) must not pass. It printed "errors: connection 3" and
exited 0. The summary and --json are still written, since the requests that succeeded say something."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from prefixfleet.cli import build_parser, main
from prefixfleet.fleet.cli import LOAD_EXIT_STATUS, load_exit_status
from prefixfleet.fleet.load import RequestOutcome, summarize


def closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: a connection is refused at once
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_run_whose_every_request_failed_exits_1_and_still_writes_its_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "load.json"
    argv = ["load", "--target", f"http://127.0.0.1:{closed_port()}", "--workload", "prefixroute"]
    assert main([*argv, "--set", "num_requests=3", "--no-progress", "--json", str(out)]) == 1
    captured = capsys.readouterr()
    assert "errors: connection 3" in captured.out
    assert "load: 3 of 3 requests failed (exit status 1)" in captured.err
    assert json.loads(out.read_text())["errors"] == 3


def test_one_failed_request_is_enough_and_none_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    served = [RequestOutcome(i, "t", ok=True, ttft_s=0.1, latency_s=0.2) for i in range(99)]
    assert load_exit_status(summarize(served, 1.0)) == 0
    assert capsys.readouterr().err == ""
    failed = RequestOutcome(99, "t", ok=False, error="http 503")
    assert load_exit_status(summarize([*served, failed], 1.0)) == 1
    assert "load: 1 of 100 requests failed" in capsys.readouterr().err


def test_the_exit_status_is_in_load_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["load", "--help"])
    assert " ".join(LOAD_EXIT_STATUS.split()) in " ".join(capsys.readouterr().out.split())
