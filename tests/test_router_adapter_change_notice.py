"""A LoRA adapter loaded or unloaded through the sidecar rewrites its member record at once, with no
state notice.

Specification: ``state <worker> <state>`` on the events channel announces a change of the worker's
state (docs/redis.md: for people and tooling). An adapter change is no state change: the sidecar
registers its member record again at once (its ``adapters`` and, for vLLM, ``served_models``), not
at its next periodic round, but publishes no notice. Before, it raised the state-changed event to
get the prompt round, so every adapter load and unload published ``state w0 ready`` though the
state had not changed (docs/gateway.md even said so).

Real processes: Valkey, a vLLM emulator allowing run-time LoRA updates, its sidecar publishing every
30 s only (so the record changing within the test's wait is the prompt round). Each step waits on
the member record; a state change made afterwards (``warming``) is the sentinel that every notice
published before it has arrived: the notices must be that one alone.
"""

from __future__ import annotations

import httpx
import pytest
import redis
from control_fixtures import fleet_token_now, token_header
from fleet_fixtures import RedisServer, Spawner, free_port, prefixfleet_argv, wait_for_http, wait_until

from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import decode_load, decode_member

pytestmark = pytest.mark.timeout(120)
FLEET = "adapternotice"
BASE = "base-model"


def member_adapters(client: redis.Redis) -> list[str] | None:
    raw = client.hget(FleetKeys(FLEET).members, "w0")
    return list(decode_member(raw).adapters) if raw is not None else None


def engine_ok(client: redis.Redis) -> bool:
    raw = client.get(FleetKeys(FLEET).load("w0"))
    return raw is not None and decode_load(raw).engine_ok


def notices(events: redis.client.PubSub, until: str) -> list[str]:
    """The state notices of w0 up to and including ``state w0 <until>``."""
    seen: list[str] = []

    def arrived() -> bool:
        message = events.get_message(timeout=0.2)
        if message is not None and message["type"] == "message":
            data = message["data"].decode()
            if data.startswith("state w0 "):
                seen.append(data)
        return f"state w0 {until}" in seen

    wait_until(arrived, 30, f"the notice 'state w0 {until}'", interval=0)
    return seen


def test_an_adapter_change_rewrites_the_record_at_once_without_a_state_notice(
    spawn: Spawner, redis_server: RedisServer
) -> None:
    engine_port, sidecar_port = free_port(), free_port()
    engine_argv = prefixfleet_argv(
        "emulator", "--port", str(engine_port), "--api", "vllm", "--model", BASE, "--enable-lora",
    )  # fmt: skip
    engine = spawn(engine_argv, name="engine", env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"})
    sidecar_argv = prefixfleet_argv(
        "router", "sidecar", "--engine", f"http://127.0.0.1:{engine_port}", "--redis", redis_server.url,
        "--port", str(sidecar_port), "--worker-id", "w0", "--fleet", FLEET, "--publish-interval", "30",
    )  # fmt: skip
    sidecar = spawn(sidecar_argv, name="sidecar")
    url = f"http://127.0.0.1:{sidecar_port}"
    wait_for_http(f"http://127.0.0.1:{engine_port}/health", proc=engine.proc)
    wait_for_http(f"{url}/prefixfleet/status", proc=sidecar.proc)
    client = redis.Redis.from_url(redis_server.url, socket_timeout=30)
    wait_until(lambda: member_adapters(client), 30, "w0's member record", done=lambda got: got == [])
    wait_until(lambda: engine_ok(client), 30, "w0's load record with its engine up (start-up done)")
    events = client.pubsub(ignore_subscribe_messages=True)
    events.subscribe(FleetKeys(FLEET).events)
    control = token_header(fleet_token_now(redis_server.url, FLEET))
    try:
        with httpx.Client(timeout=30) as http:
            loaded = http.post(
                f"{url}/v1/load_lora_adapter", json={"lora_name": "C", "lora_path": "/c"}, headers=control
            )
            assert loaded.status_code == 200, loaded.text
            # within the wait, far under the 30 s publish interval: the prompt round wrote it
            wait_until(
                lambda: member_adapters(client), 20, "the record to list C", done=lambda got: got == ["C"]
            )
            unloaded = http.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "C"}, headers=control)
            assert unloaded.status_code == 200, unloaded.text
            wait_until(
                lambda: member_adapters(client), 20, "the record to drop C", done=lambda got: got == []
            )
            changed = http.post(f"{url}/prefixfleet/state", json={"state": "warming"}, headers=control)
            assert changed.status_code == 200, changed.text
        assert notices(events, "warming") == ["state w0 warming"]
    finally:
        events.close()
