"""`prefixfleet emulator` refuses a bad value naming the flag the user typed (--max-running), not the
EmulatorConfig field behind it (max_running): one line, exit 2, before anything listens."""

from __future__ import annotations

import pytest

from prefixfleet.cli import main

BASE = ["emulator", "--port", "0"]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--max-running", "0"], "--max-running must be a positive integer, got 0"),
        (["--chunk-tokens", "-3"], "--chunk-tokens must be a positive integer, got -3"),
        (["--cache-tokens", "0"], "--cache-tokens must be a positive integer, got 0"),
        (["--max-prompt-tokens", "0"], "--max-prompt-tokens must be a positive integer, got 0"),
        (["--max-new-tokens-limit", "-1"], "--max-new-tokens-limit must be a non-negative integer, got -1"),
        (["--model", " "], "--model must be a non-empty string"),
        (["--model-revision", ""], "--model-revision must be a non-empty string"),
        (
            ["--cache-tokens", "100", "--max-prompt-tokens", "500"],
            "--max-prompt-tokens (500) must be smaller than --cache-tokens (100): a prompt and its first "
            "output token must fit in the KV cache",
        ),
        # no --max-prompt-tokens given: its default (cache tokens - 1) is not what the user typed
        (
            ["--cache-tokens", "1"],
            "--cache-tokens must be at least 2 (a prompt and its first output token), got 1",
        ),
        (
            ["--max-running", "0", "--chunk-tokens", "0"],
            "--max-running must be a positive integer, got 0; "
            "--chunk-tokens must be a positive integer, got 0",
        ),
    ],
)
def test_a_bad_value_names_the_flag(flags: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"prefixfleet emulator: error: {said}\n"
