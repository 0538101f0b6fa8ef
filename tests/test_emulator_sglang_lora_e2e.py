"""SGLang LoRA adapters in the cache identity, as real processes: Valkey, an SGLang emulator serving
a base model with two adapters (``--lora-paths A=... {"lora_name": "B", ...}``), its sidecar, a
gateway.

Specification: the sidecar learns the adapters from the engine's ``/get_server_info`` (``lora_paths``)
and the gateway lists them; a ``/generate`` naming adapter A by ``lora_path`` is cached under A, so
the same prompt under B or the base model is a miss in the engine and predicted none by the gateway
and the sidecar's mirror (no overpredicted tokens), while A's repeat is predicted and found a hit;
``model: "base:A"`` on ``/v1/completions`` names A too. An adapter the engine has not loaded is its
400; loaded at run time through the sidecar (SGLang's ``/load_lora_adapter``, an admin route) it
joins the worker's record. The vLLM counterpart is tests/test_lora_e2e.py.
"""

from __future__ import annotations

import httpx
import pytest
from control_fixtures import fleet_token_now, token_header
from fleet_fixtures import RedisServer, Spawner, free_port, prefixfleet_argv, wait_for_http, wait_until
from test_lora_e2e import get_json, matched_tokens, worker_in_view

from prefixfleet.router.proxying import WORKER_HEADER

pytestmark = pytest.mark.timeout(120)
FLEET = "lora"  # test_lora_e2e's helpers look the worker up in this fleet's gateway view
BASE = "base-model"
PROMPT = "sglang adapter test " + " ".join(f"word{j}" for j in range(96))


def service(spawn: Spawner, name: str, *argv: str) -> str:
    """Spawn ``prefixfleet ARGV --port <free>``; its URL."""
    port = free_port()
    spawn(prefixfleet_argv(*argv, "--port", str(port)), name=name)
    return f"http://127.0.0.1:{port}"


def start(spawn: Spawner, redis: RedisServer) -> tuple[str, str]:
    """Engine, sidecar and gateway, once the gateway sees the adapters A and B."""
    loras = ("--lora-paths", "A=/loras/a", '{"lora_name": "B", "lora_path": "/loras/b"}')
    engine = service(
        spawn, "engine", "emulator", "--time-scale", "20", "--model", BASE, "--enable-cache-report", *loras
    )
    worker = ("--worker-id", "w1", "--fleet", FLEET, "--publish-interval", "0.1")
    sidecar = service(
        spawn, "sidecar", "router", "sidecar", "--engine", engine, "--redis", redis.url, *worker
    )
    gateway = service(
        spawn,
        "gateway",
        "router",
        "gateway",
        "--redis",
        redis.url,
        "--fleet",
        FLEET,
        "--refresh-interval",
        "0.1",
    )
    for url in (f"{engine}/health", f"{sidecar}/prefixfleet/status", f"{gateway}/health"):
        wait_for_http(url)
    wait_until(
        lambda: worker_in_view(gateway).get("adapters"), 30, "the gateway to see w1's adapters",
        done=lambda got: got == ["A", "B"],
    )  # fmt: skip
    return gateway, sidecar


def generate(client: httpx.Client, gateway: str, lora_path: str | None, ending: str) -> int:
    """One /generate of PROMPT and ``ending`` naming ``lora_path`` through the gateway; the engine's
    cached tokens. Each request ends apart: a hit is PROMPT's tokens, never an exact repeat (which
    SGLang reports one token short, its last token recomputed)."""
    body: dict[str, object] = {"text": f"{PROMPT} {ending}", "sampling_params": {"max_new_tokens": 1}}
    if lora_path is not None:
        body["lora_path"] = lora_path
    answer = client.post(f"{gateway}/generate", json=body)
    assert (answer.status_code, answer.headers.get(WORKER_HEADER)) == (200, "w1"), answer.text
    return answer.json()["meta_info"]["cached_tokens"]


def test_a_prompt_cached_under_sglang_adapter_a_is_no_predicted_hit_for_b(
    spawn: Spawner, redis_server: RedisServer
) -> None:
    gateway, sidecar = start(spawn, redis_server)
    with httpx.Client(timeout=30) as client:
        assert generate(client, gateway, "A", "one") == 0  # a cold cache
        wait_until(lambda: worker_in_view(gateway).get("summary_blocks", 0), 30, "w1's summary of A's prompt")
        before = matched_tokens(gateway)
        assert generate(client, gateway, "A", "two") > 0  # PROMPT is a hit in the engine under A
        after_a = matched_tokens(gateway)
        assert after_a > before  # and predicted so
        assert generate(client, gateway, "B", "three") == 0  # the engine caches per adapter
        assert generate(client, gateway, None, "four") == 0  # and the base model apart
        assert matched_tokens(gateway) == after_a  # neither was predicted a hit
        body = {"model": f"{BASE}:A", "prompt": f"{PROMPT} five", "max_tokens": 1}
        completion = client.post(f"{gateway}/v1/completions", json=body)
        assert completion.status_code == 200, completion.text
        assert completion.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # base:A is A
        refused = client.post(f"{gateway}/generate", json={"text": PROMPT, "lora_path": "C"})
        assert refused.status_code == 400, refused.text
        assert "The following requested LoRA adapters are not loaded: C" in refused.text
        control = token_header(fleet_token_now(redis_server.url, FLEET))
        body = {"lora_name": "C", "lora_path": "/loras/c"}
        loaded = client.post(f"{sidecar}/load_lora_adapter", json=body, headers=control)
        assert loaded.status_code == 200 and loaded.json()["success"] is True, loaded.text
        wait_until(
            lambda: worker_in_view(gateway),
            30,
            "w1's record to list C",
            done=lambda w: w["adapters"] == ["A", "B", "C"],
        )
        assert generate(client, gateway, "C", "six") == 0  # C's own cache: PROMPT is no hit there
    mirror = get_json(f"{sidecar}/prefixfleet/status")["mirror"]
    assert mirror["overpredicted_tokens"] == 0, mirror
    assert mirror["predicted_cached_tokens"] == mirror["engine_cached_tokens"] > 0, mirror
