"""Pre-warming keeps a LoRA adapter's identity (real processes: vLLM emulators with adapters, one
sidecar each, no Redis).

Specification:
* a prefix the holder cached under adapter A is published under A's identity, and the holder's
  ``GET /prefixfleet/prefix/{hash}`` answers the request that named A (not a base-model request
  with the same prompt sent after it) and says ``lora_adapter: "A"``;
* warming a replica whose engine has A replays that request: the next request naming A there is a
  hit, one naming B is not;
* a replica whose engine has not loaded A refuses to replay it, saying so, and its engine is sent
  nothing for it.
"""

from __future__ import annotations

import json

import aiohttp
import pytest
from fleet_fixtures import Spawner, eventually, free_port, prefixfleet_argv, wait_for_http

from prefixfleet.router.blockhash import CacheIdentity, block_hashes
from prefixfleet.tokenizer import tokenize
from tests.test_prewarm_exemplars import Replica, cached_of, post

pytestmark = pytest.mark.timeout(120)
MODEL = "base-model"
TEXT = "the adapter warm-up tenant asks the sql assistant about its schema first " * 8


def start(spawn: Spawner, name: str, *lora_flags: str) -> Replica:
    port = free_port()
    argv = ["--port", str(port), "--time-scale", "50", "--cache-tokens", "20000", "--api", "vllm",
            "--model", MODEL, "--enable-prompt-tokens-details", *lora_flags]  # fmt: skip
    proc = spawn(prefixfleet_argv("emulator", *argv), name=f"engine-{name}")
    engine = f"http://127.0.0.1:{port}"
    wait_for_http(f"{engine}/health", proc=proc.proc)
    port = free_port()
    argv = ["--engine", engine, "--port", str(port), "--worker-id", name]
    sidecar = spawn(prefixfleet_argv("router", "sidecar", *argv), name=f"sidecar-{name}")
    wait_for_http(f"http://127.0.0.1:{port}/prefixfleet/status", proc=sidecar.proc)
    return Replica(engine, f"http://127.0.0.1:{port}")


async def status(http: aiohttp.ClientSession, replica: Replica) -> dict:
    async with http.get(f"{replica.sidecar}/prefixfleet/status") as resp:
        return await resp.json()


async def complete(http: aiohttp.ClientSession, replica: Replica, model: str, text: str) -> int:
    body = {"model": model, "prompt": text, "max_tokens": 2}
    code, answer = await post(http, f"{replica.sidecar}/v1/completions", body)
    assert code == 200, answer
    return cached_of(answer)


async def test_an_adapters_prefix_is_warmed_under_that_adapter_and_only_where_it_is_loaded(
    spawn: Spawner,
) -> None:
    loras = ("--enable-lora", "--lora-modules", "A=/loras/a", "B=/loras/b")
    holder, cold, bare = start(spawn, "holder", *loras), start(spawn, "cold", *loras), start(spawn, "bare")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        for replica, adapters in ((holder, ["A", "B"]), (cold, ["A", "B"]), (bare, [])):
            await eventually(
                lambda r=replica: status(http, r), 30, "the sidecar to learn its engine",
                done=lambda got, a=adapters: got["engine_api"] == "vllm" and got["adapters"] == a,
            )  # fmt: skip
        facts = await status(http, holder)
        block = facts["block_tokens"]
        assert await complete(http, holder, "A", TEXT + "first question?") == 0
        # the same prompt under the base model, after it: a kept request of another identity
        assert await complete(http, holder, MODEL, TEXT + "first question?") == 0

        tokens = list(tokenize(TEXT))[: len(tokenize(TEXT)) // block * block]
        seed = CacheIdentity(facts["model"], facts["revision"], "A").seed()
        sid = f"{block_hashes(tokens, seed, block)[-1]:016x}"
        async with http.get(f"{holder.sidecar}/prefixfleet/prefix/{sid}") as resp:
            assert resp.status == 200, await resp.text()
            held = json.loads(await resp.text())
        assert held["lora_adapter"] == "A" and held["adapter"] == ""
        assert held["request"]["body"]["model"] == "A"

        code, answer = await post(
            http, f"{cold.sidecar}/prefixfleet/warm", {"source": holder.sidecar, "hashes": [sid]}
        )
        assert code == 200, answer
        assert json.loads(answer)["results"][sid]["status"] == "ok", answer
        assert await complete(http, cold, "A", TEXT + "a new question?") >= len(tokens) - block
        assert await complete(http, cold, "B", TEXT + "a new question?") == 0

        code, answer = await post(
            http, f"{bare.sidecar}/prefixfleet/warm", {"source": holder.sidecar, "hashes": [sid]}
        )
        assert code == 200, answer
        result = json.loads(answer)["results"][sid]
        assert result["status"] == "failed" and "LoRA adapter 'A'" in result["error"], result
        assert (await status(http, bare))["mirror"]["compared_requests"] == 0  # its engine got nothing
