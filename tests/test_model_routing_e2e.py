"""Model-aware routing as real processes: Valkey, two engine emulators serving different models
behind their sidecars (w0: vLLM's API serving ``model-a``, w1: SGLang's serving ``model-b``), one
gateway.

Specification:
* each sidecar publishes the names its engine serves and the gateway sees them;
* a request naming a model always lands on a worker serving it (the worker header says which): no
  vLLM 404 for a name it does not serve, no SGLang answer from the wrong model;
* a request naming a model no worker lists is still answered, by whichever worker it goes to;
* ``GET /v1/models`` through the gateway lists both models.
"""

from __future__ import annotations

import json
import urllib.request

import httpx
import pytest
from fleet_fixtures import RedisServer, Spawner, free_port, prefixfleet_argv, wait_for_http, wait_until

from prefixfleet.router.proxying import WORKER_HEADER

pytestmark = pytest.mark.timeout(120)
FLEET = "models"
ENGINES = {"w0": ("vllm", "model-a"), "w1": ("sglang", "model-b")}


def served_in_view(gateway_url: str) -> dict[str, list[str]]:
    """Each routable worker's served names as the gateway sees them ({} while it does not answer)."""
    try:
        with urllib.request.urlopen(f"{gateway_url}/prefixfleet/view", timeout=10) as resp:
            return {w["worker_id"]: w["served_models"] for w in json.load(resp)["workers"] if w["routable"]}
    except OSError:
        return {}


def start(spawn: Spawner, redis: RedisServer) -> str:
    engines, sidecars = {}, {}
    for wid, (api, model) in ENGINES.items():
        port = free_port()
        argv = prefixfleet_argv(
            "emulator", "--port", str(port), "--time-scale", "20", "--api", api, "--model", model
        )
        spawn(argv, name=f"engine-{wid}")
        engines[wid] = f"http://127.0.0.1:{port}"
    for wid, engine_url in engines.items():
        port = free_port()
        argv = prefixfleet_argv(
            "router", "sidecar", "--engine", engine_url, "--redis", redis.url, "--port", str(port),
            "--worker-id", wid, "--fleet", FLEET, "--publish-interval", "0.1",
        )  # fmt: skip
        spawn(argv, name=f"sidecar-{wid}")
        sidecars[wid] = f"http://127.0.0.1:{port}"
    port = free_port()
    argv = prefixfleet_argv(
        "router", "gateway", "--redis", redis.url, "--port", str(port), "--fleet", FLEET,
        "--refresh-interval", "0.1",
    )  # fmt: skip
    spawn(argv, name="gateway")
    gateway = f"http://127.0.0.1:{port}"
    for url in [*engines.values(), *sidecars.values()]:
        wait_for_http(f"{url}/health" if url in engines.values() else f"{url}/prefixfleet/status")
    wait_for_http(f"{gateway}/health")
    expected = {wid: [model] for wid, (_api, model) in ENGINES.items()}
    wait_until(
        lambda: served_in_view(gateway), 30, "the gateway to see both served models", done=expected.__eq__
    )
    return gateway


def test_requests_naming_a_model_land_on_a_worker_serving_it(
    spawn: Spawner, redis_server: RedisServer
) -> None:
    gateway = start(spawn, redis_server)
    serving = {model: wid for wid, (_api, model) in ENGINES.items()}
    with httpx.Client(timeout=30) as client:
        for i in range(8):
            for model, wid in serving.items():
                # distinct prompts: each a new prefix, free to go to either worker by cache and load
                prompt = f"request {i} for {model}: " + " ".join(f"w{i}x{j}" for j in range(20 + i))
                body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
                answer = client.post(f"{gateway}/v1/chat/completions", json=body)
                assert (answer.status_code, answer.headers[WORKER_HEADER]) == (200, wid), answer.text
                assert answer.json()["model"] == model
        unknown = client.post(
            f"{gateway}/v1/completions", json={"model": "default", "prompt": "hello", "max_tokens": 2}
        )
        models = client.get(f"{gateway}/v1/models")
    # no worker lists "default": it goes to either, and that engine answers it (vLLM: its own 404)
    engine_answer = {"w0": 404, "w1": 200}[unknown.headers[WORKER_HEADER]]
    assert unknown.status_code == engine_answer, unknown.text
    assert models.status_code == 200
    assert sorted(card["id"] for card in models.json()["data"]) == ["model-a", "model-b"]
