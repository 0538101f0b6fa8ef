"""``prefixfleet compare``'s default workload is named as the docs and the user write it.

Without ``--workload`` compare replays the shipped Mooncake trace, and every refusal named it by
its absolute path ("workload 'trace:/work/main/traces/mooncake_synthetic_trace.jsonl' has no
setting ..."), which nobody typed. Run where the trace lies below the working directory it is
``trace:traces/mooncake_synthetic_trace.jsonl`` (as docs/simulator.md writes it); run elsewhere it
stays absolute (it is found beside the package, and a relative name would point nowhere); a
``--trace`` path is named as typed. The default trace is also an input: ``--json`` naming it was
accepted, and the finished run would have replaced the shipped trace with its results.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixfleet.cli import main
from prefixfleet.fleet.compare import path_as_typed

REPO = Path(__file__).resolve().parents[1]
SHIPPED = "traces/mooncake_synthetic_trace.jsonl"
TRACE_LINE = '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
UNKNOWN = "has no setting 'bogus'; settings: block_tokens, limit, speedup, trace_block_tokens"


def _refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["compare", "--no-progress", *argv]) == 2
    return capsys.readouterr().err


def test_a_path_below_the_working_directory_is_named_relative_to_it() -> None:
    assert path_as_typed(Path("/repo/traces/t.jsonl"), Path("/repo")) == "traces/t.jsonl"
    assert path_as_typed(Path("/repo/traces/t.jsonl"), Path("/elsewhere")) == "/repo/traces/t.jsonl"
    # a sibling sharing the prefix is not below it
    assert path_as_typed(Path("/repo2/t.jsonl"), Path("/repo")) == "/repo2/t.jsonl"


def test_the_default_trace_is_named_as_the_docs_write_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)
    err = _refusal(["--json", str(tmp_path / "c.json"), "--set", "bogus=1"], capsys)
    assert err == f"prefixfleet compare: error: workload 'trace:{SHIPPED}' {UNKNOWN}\n"
    assert f"trace:{SHIPPED}" in (REPO / "docs" / "simulator.md").read_text()


def test_the_default_trace_run_from_elsewhere_keeps_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    err = _refusal(["--json", "c.json", "--set", "bogus=1"], capsys)
    assert err == f"prefixfleet compare: error: workload 'trace:{REPO / SHIPPED}' {UNKNOWN}\n"


@pytest.mark.parametrize("relative", [True, False])
def test_a_trace_flag_is_named_as_typed(
    relative: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "t.jsonl").write_text(TRACE_LINE)
    monkeypatch.chdir(tmp_path)
    typed = "./t.jsonl" if relative else str(tmp_path / "t.jsonl")
    err = _refusal(["--json", "c.json", "--trace", typed, "--set", "bogus=1"], capsys)
    assert err == f"prefixfleet compare: error: workload 'trace:{typed}' {UNKNOWN}\n"


def test_json_naming_the_default_trace_is_refused_before_the_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # '--set bogus=1' stops the command before any run whichever check comes first: without the
    # input check this test fails on the bogus setting instead of replacing the shipped trace
    monkeypatch.chdir(REPO)
    before = (REPO / SHIPPED).read_bytes()
    err = _refusal(["--json", SHIPPED, "--set", "bogus=1"], capsys)
    assert err == (
        f"prefixfleet compare: error: --json {SHIPPED} is the input {SHIPPED}; "
        "writing there would replace it\n"
    )
    assert (REPO / SHIPPED).read_bytes() == before
