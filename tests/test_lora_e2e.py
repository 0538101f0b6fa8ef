"""LoRA adapters in the cache identity, as real processes: Valkey, a vLLM emulator serving a base
model with two LoRA adapters (``--enable-lora --lora-modules A=... B=...``), its sidecar, a gateway.

Specification: once adapter A's prompt is cached on the worker, the same prompt naming adapter B
(or the base model) is predicted no hit by the gateway (its matched-tokens counter does not move)
and none by the sidecar's mirror (its predictions stay equal to what the engine reports: no
overpredicted tokens), while the same prompt naming A again is predicted, and found, as a hit. The
engine itself caches per adapter, as vLLM does (the adapter is among a block hash's extra keys).
Before, every request was hashed under the worker's one configured identity: B was a predicted hit.
"""

from __future__ import annotations

import json
import urllib.request

import httpx
import pytest
from control_fixtures import fleet_token_now, token_header
from fleet_fixtures import RedisServer, Spawner, free_port, prefixfleet_argv, wait_for_http, wait_until

from prefixfleet.router.proxying import WORKER_HEADER

pytestmark = pytest.mark.timeout(120)
FLEET = "lora"
BASE = "base-model"
PROMPT = "adapter test " + " ".join(f"word{j}" for j in range(96))


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def worker_in_view(gateway: str) -> dict:
    """The gateway's view of w1 ({} while it has none or does not answer)."""
    try:
        workers = get_json(f"{gateway}/prefixfleet/view")["workers"]
    except OSError:
        return {}
    return next((w for w in workers if w["worker_id"] == "w1" and w["routable"]), {})


def matched_tokens(gateway: str) -> float:
    """prefixfleet_gateway_matched_tokens_total over every label: tokens predicted cached."""
    with urllib.request.urlopen(f"{gateway}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("prefixfleet_gateway_matched_tokens_total{")
    )


LORA_MODULES = ("--lora-modules", "A=/loras/a", '{"name": "B", "path": "/loras/b"}')


def start(
    spawn: Spawner,
    redis: RedisServer,
    lora_flags: tuple[str, ...] = LORA_MODULES,
    adapters: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[str, str]:
    """Engine (its LoRA flags), sidecar and gateway, once the gateway sees ``adapters`` (default A, B)."""
    port = free_port()
    engine_argv = prefixfleet_argv(
        "emulator", "--port", str(port), "--time-scale", "20", "--api", "vllm", "--model", BASE,
        "--enable-prompt-tokens-details", "--enable-lora", *lora_flags,
    )  # fmt: skip
    spawn(engine_argv, name="engine", env=env)
    engine = f"http://127.0.0.1:{port}"
    port = free_port()
    sidecar_argv = prefixfleet_argv(
        "router", "sidecar", "--engine", engine, "--redis", redis.url, "--port", str(port),
        "--worker-id", "w1", "--fleet", FLEET, "--publish-interval", "0.1",
    )  # fmt: skip
    spawn(sidecar_argv, name="sidecar")
    sidecar = f"http://127.0.0.1:{port}"
    port = free_port()
    gateway_argv = prefixfleet_argv(
        "router", "gateway", "--redis", redis.url, "--port", str(port), "--fleet", FLEET,
        "--refresh-interval", "0.1",
    )  # fmt: skip
    spawn(gateway_argv, name="gateway")
    gateway = f"http://127.0.0.1:{port}"
    wait_for_http(f"{engine}/health")
    wait_for_http(f"{sidecar}/prefixfleet/status")
    wait_for_http(f"{gateway}/health")
    want = ["A", "B"] if adapters is None else adapters
    wait_until(
        lambda: worker_in_view(gateway).get("adapters"), 30, "the gateway to see w1's adapters",
        done=lambda got: got == want,
    )  # fmt: skip
    return gateway, sidecar


def complete(client: httpx.Client, gateway: str, model: str) -> int:
    """One completion of PROMPT naming ``model`` through the gateway; the engine's cached tokens."""
    answer = client.post(
        f"{gateway}/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 1}
    )
    assert (answer.status_code, answer.headers[WORKER_HEADER]) == (200, "w1"), answer.text
    assert answer.json()["model"] == model
    return answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_prompt_cached_under_adapter_a_is_no_predicted_hit_for_adapter_b(
    spawn: Spawner, redis_server: RedisServer
) -> None:
    gateway, sidecar = start(spawn, redis_server)
    models = get_json(f"{gateway}/v1/models")["data"]
    assert {(m["id"], m["parent"]) for m in models} == {(BASE, None), ("A", BASE), ("B", BASE)}
    with httpx.Client(timeout=30) as client:
        assert complete(client, gateway, "A") == 0  # a cold cache
        # the summary shows A's blocks (the gateway's own send is in its overlay anyway)
        wait_until(lambda: worker_in_view(gateway).get("summary_blocks", 0), 30, "w1's summary of A's prompt")
        before = matched_tokens(gateway)
        found = complete(client, gateway, "A")
        after_a = matched_tokens(gateway)
        assert found > 0 and after_a - before > 0  # the repeat is a hit, predicted and found
        assert complete(client, gateway, "B") == 0  # the engine caches per adapter
        assert matched_tokens(gateway) == after_a  # and the gateway no longer predicts one
        assert complete(client, gateway, BASE) == 0
        assert matched_tokens(gateway) == after_a
    mirror = get_json(f"{sidecar}/prefixfleet/status")["mirror"]
    # every prediction the sidecar's mirror made matched the engine's report: B's and the base
    # model's prompts were not taken for A's blocks
    assert mirror["compared_requests"] == 4
    assert mirror["overpredicted_tokens"] == 0, mirror
    assert mirror["predicted_cached_tokens"] == mirror["engine_cached_tokens"] > 0, mirror


def test_an_adapter_loaded_at_run_time_through_the_sidecar_is_hashed_under_its_name_at_once(
    spawn: Spawner, redis_server: RedisServer
) -> None:
    """vLLM loads adapters at run time (VLLM_ALLOW_RUNTIME_LORA_UPDATING, POST /v1/load_lora_adapter,
    an admin route of the sidecar): the sidecar's member record follows at once, so the new
    adapter's requests are not predicted hits on the base model's blocks (before, the adapters were
    read at the engine's start only)."""
    runtime = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}
    gateway, sidecar = start(spawn, redis_server, (), [], env=runtime)
    control = token_header(fleet_token_now(redis_server.url, FLEET))
    with httpx.Client(timeout=30) as client:
        assert complete(client, gateway, BASE) == 0
        wait_until(lambda: worker_in_view(gateway).get("summary_blocks", 0), 30, "w1's summary of the prompt")
        loaded = client.post(
            f"{sidecar}/v1/load_lora_adapter",
            json={"lora_name": "C", "lora_path": "/loras/c"},
            headers=control,
        )
        assert loaded.status_code == 200, loaded.text
        seen = wait_until(
            lambda: worker_in_view(gateway),
            30,
            "w1's record to list C",
            done=lambda w: w["adapters"] == ["C"],
        )
        assert seen["served_models"] == [BASE, "C"]
        before = matched_tokens(gateway)
        assert complete(client, gateway, "C") == 0  # a miss in the engine
        assert matched_tokens(gateway) == before  # and predicted so
        assert complete(client, gateway, BASE) > 0  # the base model's blocks are still there
        unloaded = client.post(f"{sidecar}/v1/unload_lora_adapter", json={"lora_name": "C"}, headers=control)
        assert unloaded.status_code == 200, unloaded.text
        wait_until(
            lambda: worker_in_view(gateway), 30, "w1's record to drop C", done=lambda w: w["adapters"] == []
        )
    mirror = get_json(f"{sidecar}/prefixfleet/status")["mirror"]
    assert mirror["overpredicted_tokens"] == 0, mirror
