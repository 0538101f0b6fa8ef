"""Request ids through the data plane as a user starts it: ``prefixfleet emulator``, ``router
sidecar`` and ``router gateway --request-id-headers ...`` as processes (no Redis: a static
``--worker``). A client's id from the first configured header present comes back in
``X-Request-Id`` on streamed and whole answers; without one, each request gets its own generated
id, shaped as SGLang's router shapes them. (What reaches the engine is checked in
tests/test_gateway_request_id.py, with a stand-in engine that records headers.)
"""

from __future__ import annotations

import re

import httpx
import pytest
from fleet_fixtures import Spawner, free_port, prefixfleet_argv

pytestmark = pytest.mark.timeout(120)


def test_ids_through_gateway_sidecar_and_emulator_processes(spawn: Spawner) -> None:
    engine, sidecar, gateway = free_port(), free_port(), free_port()
    spawn(
        prefixfleet_argv("emulator", "--port", str(engine), "--time-scale", "20"),
        name="engine",
        ready_url=f"http://127.0.0.1:{engine}/health",
    )
    spawn(
        prefixfleet_argv(
            "router", "sidecar", "--engine", f"http://127.0.0.1:{engine}", "--port", str(sidecar),
            "--worker-id", "w0", "--model", "m", "--revision", "r",
        ),
        name="sidecar",
        ready_url=f"http://127.0.0.1:{sidecar}/prefixfleet/status",
    )  # fmt: skip
    spawn(
        prefixfleet_argv(
            "router", "gateway", "--port", str(gateway), "--worker", f"http://127.0.0.1:{sidecar}",
            "--request-id-headers", "x-trace-id", "x-request-id",
        ),
        name="gateway",
        ready_url=f"http://127.0.0.1:{gateway}/health",
    )  # fmt: skip
    url = f"http://127.0.0.1:{gateway}/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}
    with httpx.Client(timeout=30) as client:
        with client.stream(
            "POST", url, json={**body, "stream": True}, headers={"X-Trace-Id": "t-1", "X-Request-Id": "r-1"}
        ) as streamed:
            events = streamed.read()
        whole = client.post(url, json=body, headers={"X-Request-Id": "r-2"})
        generated = [client.post(url, json=body) for _ in range(3)]
    assert streamed.status_code == 200 and b"[DONE]" in events
    assert streamed.headers.get_list("x-request-id") == ["t-1"]  # the first configured header wins
    assert (whole.status_code, whole.headers["x-request-id"]) == (200, "r-2")
    ids = [answer.headers["x-request-id"] for answer in generated]
    assert all(re.fullmatch(r"chatcmpl-[0-9a-f]{24}", rid) for rid in ids), ids
    assert len(set(ids)) == 3
