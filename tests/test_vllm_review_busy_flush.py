"""The sidecar's flush in front of a busy vLLM: refused, the mirror kept, as SGLang's busy flush is.

vLLM's ``POST /reset_prefix_cache`` answers 200 whether or not it reset anything ("we currently do
not check if the prefix cache is successfully reset", vllm/entrypoints/serve/cache/api_router.py);
its KV cache manager refuses while any request holds blocks (logging "Failed to reset prefix cache
because some blocks are not freed yet"). The sidecar took the 200 as done and emptied its mirror,
while the engine kept every prefix: gateways then routed the fleet's prefixes away from the one
replica that held them, and ``prefixfleet up``'s flush between policies (which retries a refused
flush until the engine is idle, as SGLang's answers 400 while busy) could leave a warm engine
behind a cold summary. With requests in flight and no ``reset_running_requests=true`` (which makes
vLLM reset anyway), the sidecar now answers 400, as SGLang does, and keeps its mirror.

The engine is the emulator's vLLM face in dev mode, which refuses a busy reset as vLLM does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from fleet_fixtures import eventually, standalone_sidecar

from prefixfleet.emulator import EmulatorConfig, EmulatorServer, VllmOptions
from prefixfleet.router import sidecar as sidecar_module
from prefixfleet.router.engine_api import vllm_resets_running

pytestmark = pytest.mark.timeout(60)

PROMPT = " ".join(f"w{i}" for i in range(200))


@pytest.fixture
async def engine() -> AsyncIterator[EmulatorServer]:
    # decode 2 tokens/s: a 1000-token answer runs for minutes, far past the test
    config = EmulatorConfig(decode_step_s=0.5, cache_tokens=40_000)
    server = await EmulatorServer(
        config, vllm=VllmOptions(enable_prompt_tokens_details=True, dev_mode=True)
    ).start()
    yield server
    await server.stop()


async def test_a_flush_while_a_request_runs_is_refused_and_the_mirror_kept(engine: EmulatorServer) -> None:
    config = standalone_sidecar(engine.url, model=None, revision=None, cache_tokens=None, engine_api="vllm")
    async with sidecar_module.listening(config) as served, aiohttp.ClientSession() as http:
        car = served.sidecar
        url = f"http://127.0.0.1:{served.port}"
        await eventually(lambda: car.s.engine.known, 20, "the sidecar to learn the engine")
        body = {"prompt": PROMPT, "max_tokens": 1000, "stream": True}
        async with http.post(f"{url}/v1/completions", json=body) as running:
            assert running.status == 200
            await running.content.readline()  # its first event: prefilled, now decoding
            held = car.s.mirror.tree.cached_tokens
            assert held >= 200 and car.s.load.in_flight == 1
            async with http.post(f"{url}/flush_cache") as resp:
                assert resp.status == 400
                message = (await resp.json())["error"]["message"]
            assert "running" in message and "reset_running_requests" in message
            assert car.s.mirror.tree.cached_tokens == held  # the engine kept it, so does the mirror
        # the running request is gone (the client left): once the engine dropped it too, the flush
        # goes through
        await eventually(lambda: car.s.load.in_flight == 0, 20, "the sidecar to see the request end")

        def idle() -> bool:
            stats = engine.engine.stats()
            return stats.num_running + stats.num_waiting == 0

        await eventually(idle, 20, "the engine to drop the aborted request")
        async with http.post(f"{url}/flush_cache") as resp:
            assert resp.status == 200
        assert car.s.mirror.tree.cached_tokens == 0
        async with http.post(f"{url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}) as resp:
            usage = (await resp.json())["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0  # and the engine is empty too


def test_a_reset_of_running_requests_is_read_as_fastapi_reads_the_bool() -> None:
    assert vllm_resets_running("reset_running_requests=true")
    assert vllm_resets_running("reset_external=true&reset_running_requests=1")
    assert not vllm_resets_running("")
    assert not vllm_resets_running("reset_running_requests=false")
    assert not vllm_resets_running("reset_external=true")
