"""The sidecar in front of the emulator's vLLM face, end to end: real processes and a real Redis.

``prefixfleet emulator --api vllm`` (vLLM's routes only: no /get_server_info, /generate,
/flush_cache; block-granular hits; /reset_prefix_cache only with VLLM_SERVER_DEV_MODE=1) and
``prefixfleet router sidecar`` in front of it. Specification:
* ``--engine-api auto`` detects vLLM; the sidecar publishes the emulator's KV capacity (its
  ``vllm:cache_config_info``) and hashes its summary in the emulator's ``--block-size``;
* a repeated prompt's second request is a cache hit in the engine's usage and in the published
  summary, and the mirror predicted exactly what the engine reported;
* ``/flush_cache`` without VLLM_SERVER_DEV_MODE=1 is a 501 naming it, and both caches are kept;
  with it, the engine and the mirror are both emptied;
* pre-warming a cold replica from a holder (token ids replayed as a vLLM completion) makes its
  engine hold the prefix: the next request there reports cached tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import redis
from control_fixtures import fleet_token_now, token_header
from fleet_fixtures import RedisServer, Spawner, eventually, free_port, prefixfleet_argv, wait_for_http

from prefixfleet.router.blockhash import CacheIdentity, block_hashes
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import decode_load
from prefixfleet.router.summary import Summary, decode_summary
from prefixfleet.tokenizer import tokenize

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

FLEET = "vllm-sidecar"
BLOCK = 32  # not vLLM's default 16: the sidecar must take the engine's
CACHE_TOKENS = 20_000  # 625 blocks
MODEL = "emulated-llm"  # the emulator's default served model name
PROMPT = "a support agent answers billing questions about invoices and refunds politely " * 8  # 96 tokens
QUESTION = PROMPT + "where is my refund for the order of last week please?"


@dataclass(frozen=True)
class Replica:
    worker: str
    url: str  # the sidecar's
    control: dict[str, str]  # the fleet's control token, read from its Redis as the operator does


def start_replica(
    spawn: Spawner, redis_server: RedisServer, worker: str, *, engine_api: str, dev_mode: bool
) -> Replica:
    engine_port, sidecar_port = free_port(), free_port()
    env = {"VLLM_SERVER_DEV_MODE": "1" if dev_mode else "0"}
    engine = spawn(
        prefixfleet_argv("emulator", "--api", "vllm", "--port", str(engine_port), "--time-scale", "50",
                         "--cache-tokens", str(CACHE_TOKENS), "--block-size", str(BLOCK),
                         "--enable-prompt-tokens-details"), name=f"engine-{worker}", env=env)  # fmt: skip
    sidecar = spawn(
        prefixfleet_argv("router", "sidecar", "--engine", f"http://127.0.0.1:{engine_port}",
                         "--engine-api", engine_api, "--redis", redis_server.url, "--port", str(sidecar_port),
                         "--worker-id", worker, "--fleet", FLEET, "--publish-interval", "0.1"),
        name=f"sidecar-{worker}")  # fmt: skip
    wait_for_http(f"http://127.0.0.1:{engine_port}/health", proc=engine.proc)
    wait_for_http(f"http://127.0.0.1:{sidecar_port}/prefixfleet/status", proc=sidecar.proc)
    return Replica(
        worker, f"http://127.0.0.1:{sidecar_port}", token_header(fleet_token_now(redis_server.url, FLEET))
    )


async def status(http: aiohttp.ClientSession, replica: Replica) -> dict[str, Any]:
    async with http.get(f"{replica.url}/prefixfleet/status") as resp:
        assert resp.status == 200
        return await resp.json()


async def cached_tokens(http: aiohttp.ClientSession, replica: Replica, prompt: str) -> int:
    """The engine's cached-token count for ``prompt`` sent as a vLLM completion via the sidecar."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    async with http.post(f"{replica.url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        answer = await resp.json()
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


def published(redis_url: str, worker: str) -> tuple[Any, Summary | None]:
    keys = FleetKeys(FLEET)
    with redis.Redis.from_url(redis_url) as client:
        load, summary = client.get(keys.load(worker)), client.get(keys.summary(worker))
    return (
        decode_load(load) if load is not None else None,
        decode_summary(summary) if summary is not None else None,
    )


def summary_holds(redis_url: str, worker: str, prompt: str) -> bool:
    """The worker's published summary claims every full block of ``prompt`` (as a gateway matches it)."""
    _load, summary = published(redis_url, worker)
    if summary is None or summary.block_tokens != BLOCK:
        return False
    tokens, seed = tokenize(prompt), CacheIdentity(MODEL, "", "").seed()
    held = summary.matched_blocks(block_hashes(tokens, seed, BLOCK))
    return summary.identity_seed == seed and held == len(tokens) // BLOCK


async def flush(http: aiohttp.ClientSession, replica: Replica) -> tuple[int, dict[str, Any]]:
    async with http.post(f"{replica.url}/flush_cache", headers=replica.control) as resp:
        return resp.status, await resp.json(content_type=None) if resp.status != 200 else {}


async def test_detected_vllm_capacity_repeat_hits_and_flush_without_dev_mode(
    spawn: Spawner, redis_server: RedisServer
) -> None:
    replica = start_replica(spawn, redis_server, "w0", engine_api="auto", dev_mode=False)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        known = await eventually(lambda: status(http, replica), 30, "the sidecar to detect the engine's API",
                                 done=lambda s: s["engine_api"] is not None)  # fmt: skip
        assert (known["engine_api"], known["model"], known["revision"]) == ("vllm", MODEL, "")
        assert known["block_tokens"] == BLOCK
        # engine_ok: published after the sidecar read the engine (identity and capacity come first)
        load = await eventually(lambda: published(redis_server.url, "w0")[0], 30, "w0's engine_ok record",
                                done=lambda load: load is not None and load.engine_ok)  # fmt: skip
        assert load.capacity_tokens == CACHE_TOKENS

        assert await cached_tokens(http, replica, PROMPT) == 0
        n = len(tokenize(PROMPT))
        assert await cached_tokens(http, replica, PROMPT) == (n - 1) // BLOCK * BLOCK > 0  # vLLM's rule
        await eventually(
            lambda: summary_holds(redis_server.url, "w0", PROMPT), 30, "the summary to hold PROMPT"
        )
        mirror = (await status(http, replica))["mirror"]
        assert mirror["predicted_cached_tokens"] == mirror["engine_cached_tokens"] == (n - 1) // BLOCK * BLOCK
        assert mirror["overpredicted_tokens"] == 0

        code, error = await flush(http, replica)
        assert code == 501 and "VLLM_SERVER_DEV_MODE=1" in error["error"]["message"], error
        assert (await status(http, replica))["load"]["cached_tokens"] > 0  # the mirror kept its copy
        assert await cached_tokens(http, replica, PROMPT) > 0  # as the engine kept its cache


async def test_prewarm_then_flush_in_dev_mode(spawn: Spawner, redis_server: RedisServer) -> None:
    holder = start_replica(spawn, redis_server, "w0", engine_api="auto", dev_mode=False)
    cold = start_replica(spawn, redis_server, "w1", engine_api="vllm", dev_mode=True)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        for replica in (holder, cold):
            await eventually(lambda r=replica: status(http, r), 30, "the sidecar to learn its engine",
                             done=lambda s: s["engine_api"] == "vllm")  # fmt: skip
        await cached_tokens(http, holder, PROMPT)
        last = block_hashes(tokenize(PROMPT), CacheIdentity(MODEL, "", "").seed(), BLOCK)[-1]
        sid = f"{last:016x}"
        async with http.post(
            f"{cold.url}/prefixfleet/warm", json={"source": holder.url, "hashes": [sid]}, headers=cold.control
        ) as resp:
            assert resp.status == 200, await resp.text()
            warmed = await resp.json()
        assert warmed["results"][sid]["status"] == "ok", warmed
        assert warmed["results"][sid]["tokens"] == len(tokenize(PROMPT)) // BLOCK * BLOCK
        # the engine holds the prefix now: the first real request is a hit
        assert await cached_tokens(http, cold, QUESTION) >= len(tokenize(PROMPT)) // BLOCK * BLOCK
        await eventually(
            lambda: summary_holds(redis_server.url, "w1", PROMPT), 30, "the summary to hold PROMPT"
        )

        code, _ = await flush(http, cold)
        assert code == 200
        assert (await status(http, cold))["load"]["cached_tokens"] == 0  # the mirror emptied with it
        assert await cached_tokens(http, cold, QUESTION) == 0  # and the engine's cache is gone
