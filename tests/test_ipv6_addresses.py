"""Replicas on IPv6 pod IPs: every URL built from a host and a port brackets an IPv6 address.

Specification:
* ``base_url`` brackets an IPv6 address and leaves IPv4 addresses, names and bracketed hosts alone;
* ``bracket_ipv6_url`` repairs the ``http://$(POD_IP):<port>`` the pod spec gives the sidecar on an
  IPv6 cluster and never changes a URL that is already valid;
* the operator's member URL for a pod with an IPv6 IP is bracketed;
* live, over the IPv6 loopback: an emulator and a sidecar bound to ``::1``, the sidecar told to
  advertise ``http://::1:<port>`` exactly as the pod spec would expand it, register a bracketed URL
  and a gateway routes a request to them;
* the pods' sidecar and gateway listen with ``--host ''`` (every interface): such a sidecar answers on
  the IPv4 and the IPv6 loopback alike (it bound 0.0.0.0, IPv4 only, before).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fleet_fixtures import RedisServer, Spawner, free_port, prefixfleet_argv, wait_for_http

from prefixfleet.operator.models import FleetSpec
from prefixfleet.operator.planner import FleetRef, ObservedPod, desired_children, pod_url, replica_template
from prefixfleet.router.addresses import base_url, bracket_ipv6_url
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import decode_member

pytestmark = pytest.mark.timeout(120)


def test_base_urls_bracket_ipv6_addresses_only() -> None:
    assert base_url("10.0.0.7", 8100) == "http://10.0.0.7:8100"
    assert base_url("fd00::12", 8100) == "http://[fd00::12]:8100"
    assert base_url("::1", 30000, "https") == "https://[::1]:30000"
    assert base_url("[fd00::12]", 8100) == "http://[fd00::12]:8100"
    assert base_url("replica-0.demo", 8100) == "http://replica-0.demo:8100"


@pytest.mark.parametrize(
    ("url", "repaired"),
    [
        ("http://fd00::12:8100", "http://[fd00::12]:8100"),
        ("http://fd00::12:8100/v1", "http://[fd00::12]:8100/v1"),
        ("http://::1:8100", "http://[::1]:8100"),
        ("http://[fd00::12]:8100", "http://[fd00::12]:8100"),
        ("http://10.0.0.7:8100", "http://10.0.0.7:8100"),
        ("https://sidecar.demo:8100/x", "https://sidecar.demo:8100/x"),
        ("http://sidecar.demo", "http://sidecar.demo"),
    ],
)
def test_an_unbracketed_ipv6_advertise_url_is_repaired_and_valid_urls_are_kept(
    url: str, repaired: str
) -> None:
    assert bracket_ipv6_url(url) == repaired


def test_the_operators_member_url_for_an_ipv6_pod_is_bracketed() -> None:
    v6 = ObservedPod(name="demo-0", phase="Running", ready=True, pod_ip="fd00::12")
    assert pod_url(v6, 8100) == "http://[fd00::12]:8100"
    v4 = ObservedPod(name="demo-1", phase="Running", ready=True, pod_ip="10.0.0.7", port_map={8100: 41001})
    assert pod_url(v4, 8100) == "http://10.0.0.7:41001"


def test_a_replica_on_the_ipv6_loopback_registers_a_bracketed_url_and_serves(tmp_path: Path) -> None:
    redis = RedisServer(free_port(), tmp_path)
    redis.start()
    spawn = Spawner(tmp_path)
    engine_port, sidecar_port, gateway_port = free_port(), free_port(), free_port()
    try:
        spawn(
            prefixfleet_argv("emulator", "--host", "::1", "--port", str(engine_port), "--time-scale", "1"),
            name="engine", ready_url=f"http://[::1]:{engine_port}/health",
        )  # fmt: skip
        spawn(
            prefixfleet_argv(
                "router", "sidecar", "--host", "::1", "--port", str(sidecar_port),
                "--engine", f"http://[::1]:{engine_port}", "--redis", redis.url,
                "--worker-id", "w0", "--fleet", "six", "--publish-interval", "0.1",
                "--advertise-url", f"http://::1:{sidecar_port}",  # the pod spec's $(POD_IP) expansion
            ),
            name="sidecar", ready_url=f"http://[::1]:{sidecar_port}/prefixfleet/status",
        )  # fmt: skip
        gateway = spawn(
            prefixfleet_argv(
                "router", "gateway", "--redis", redis.url, "--port", str(gateway_port),
                "--fleet", "six", "--refresh-interval", "0.1",
            ),
            name="gateway",
        )  # fmt: skip
        wait_for_http(f"http://127.0.0.1:{gateway_port}/health", proc=gateway.proc)  # 200 once w0 routes
        member = redis.client().hget(FleetKeys("six").members, "w0")
        assert member is not None and decode_member(member).url == f"http://[::1]:{sidecar_port}"
        resp = httpx.post(
            f"http://127.0.0.1:{gateway_port}/v1/completions",
            json={"prompt": "hello over six", "max_tokens": 2},
            timeout=30,
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers["X-Prefixfleet-Worker"] == "w0"
    finally:
        spawn.stop_all()
        redis.stop()


def listen_hosts(containers: list[dict]) -> dict[str, str]:
    out = {}
    for c in containers:
        argv = c.get("args", [])
        # without --host, prefixfleet's services listen on 127.0.0.1 only
        out[c["name"]] = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--host"), "127.0.0.1")
    return out


def test_the_planned_sidecar_and_gateway_listen_on_every_interface() -> None:
    fleet = FleetRef(name="six", namespace="prod")
    spec = FleetSpec.model_validate(
        {"model": {"name": "m", "revision": "r1"}, "engine": {"kind": "emulator"}}
    )
    template, _ = replica_template(fleet, spec, "redis://redis:6379/0")
    assert listen_hosts(template["spec"]["containers"])["sidecar"] == ""
    gateway = next(
        c for c in desired_children(fleet, spec, "redis://redis:6379/0") if c["kind"] == "Deployment"
    )
    assert set(listen_hosts(gateway["spec"]["template"]["spec"]["containers"]).values()) == {""}


def test_a_sidecar_told_to_listen_everywhere_answers_on_ipv4_and_ipv6(tmp_path: Path) -> None:
    spawn = Spawner(tmp_path)
    port = free_port()
    try:
        # the replica pod's sidecar arguments: --host '' (no Redis here: it only proxies)
        spawn(
            prefixfleet_argv(
                "router", "sidecar", "--host", "", "--port", str(port),
                "--engine", "http://127.0.0.1:9", "--worker-id", "w0",
            ),
            name="sidecar", ready_url=f"http://127.0.0.1:{port}/prefixfleet/status",
        )  # fmt: skip
        for base in (f"http://127.0.0.1:{port}", f"http://[::1]:{port}"):
            status = httpx.get(f"{base}/prefixfleet/status", timeout=10)
            assert status.status_code == 200 and status.json()["worker_id"] == "w0", base
    finally:
        spawn.stop_all()
