"""`prefixfleet emulator --api vllm` as a command: its flags, its environment, and a real process.

Specification: vLLM's flags (--block-size, --enable-prompt-tokens-details) belong to --api vllm and
SGLang's --enable-cache-report to --api sglang (one line, exit 2, otherwise); --cache-tokens must be
whole blocks (num_gpu_blocks = cache tokens / block size); VLLM_SERVER_DEV_MODE is read as vLLM reads
it (an integer) and adds /reset_prefix_cache; the process serves vLLM's routes and none of SGLang's.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from fleet_fixtures import free_port, wait_for_http

from prefixfleet.cli import build_parser, main
from prefixfleet.emulator.cli import config_from_args, vllm_options_from_args
from prefixfleet.emulator.vllm_api import VllmOptions

pytestmark = pytest.mark.timeout(90)

BASE = ["emulator", "--port", "0"]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--block-size", "16"], "--block-size is vLLM's flag: give it with --api vllm"),
        (
            ["--enable-prompt-tokens-details"],
            "--enable-prompt-tokens-details is vLLM's flag: give it with --api vllm",
        ),
        (
            ["--api", "vllm", "--enable-cache-report"],
            "--enable-cache-report is SGLang's flag; with --api vllm use --enable-prompt-tokens-details",
        ),
        (
            ["--api", "vllm", "--cache-tokens", "1000"],
            "--cache-tokens (1000) must be a multiple of --block-size (16): the KV pool is num_gpu_blocks "
            "whole blocks",
        ),
        (["--api", "vllm", "--block-size", "0"], "--block-size must be a positive integer, got 0"),
    ],
)
def test_flags_of_the_other_engine_are_refused(
    flags: list[str], said: str, capsys: pytest.CaptureFixture[str]
):
    assert main([*BASE, *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"prefixfleet emulator: error: {said}\n"


def options(flags: list[str], environ: dict[str, str]) -> VllmOptions | None:
    args = build_parser("emulator").parse_args([*BASE, *flags])
    return vllm_options_from_args(args, config_from_args(args), environ)


def test_options_follow_the_flags_and_vllms_dev_mode_variable():
    assert options([], {}) is None  # SGLang's face, as before
    assert options(["--api", "vllm"], {}) == VllmOptions(16, False, False)
    given = [
        "--api",
        "vllm",
        "--block-size",
        "32",
        "--cache-tokens",
        "3200",
        "--enable-prompt-tokens-details",
    ]
    assert options(given, {"VLLM_SERVER_DEV_MODE": "1"}) == VllmOptions(32, True, True)
    assert options(["--api", "vllm"], {"VLLM_SERVER_DEV_MODE": "0"}) == VllmOptions(16, False, False)


def test_a_dev_mode_value_vllm_cannot_read_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "yes")
    assert main([*BASE, "--api", "vllm"]) == 2
    assert (
        capsys.readouterr().err
        == "prefixfleet emulator: error: VLLM_SERVER_DEV_MODE must be an integer (0 or 1), got 'yes'\n"
    )


def request(method: str, url: str, body: object | None = None) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.parametrize("dev_mode", ["1", "0"])
def test_the_process_serves_vllms_api(tmp_path: Path, dev_mode: str):
    import os
    import sys

    port = free_port()
    log = tmp_path / "emu.log"
    argv = [sys.executable, "-c", "import sys; from prefixfleet.cli import main; sys.exit(main())"]
    argv += [
        *BASE[:1],
        "--port",
        str(port),
        "--api",
        "vllm",
        "--enable-prompt-tokens-details",
        "--time-scale",
        "50",
    ]
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": dev_mode}
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log.open("wb"), env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(url + "/health", timeout=30, proc=proc)
        status, body = request("GET", url + "/v1/models")
        assert status == 200 and json.loads(body)["data"][0]["owned_by"] == "vllm"
        assert request("GET", url + "/get_server_info")[0] == 404
        prompt = {"prompt": " ".join(f"w{i}" for i in range(40)), "max_tokens": 1}
        request("POST", url + "/v1/completions", prompt)
        status, body = request("POST", url + "/v1/completions", prompt)
        assert status == 200 and json.loads(body)["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
        assert request("POST", url + "/reset_prefix_cache")[0] == (200 if dev_mode == "1" else 404)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert "Traceback" not in log.read_text()
