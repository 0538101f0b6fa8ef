"""The operator's addresses on an IPv6 (or IPv6-first dual-stack) cluster.

Specification:
* the member URL the operator publishes for a pod and the URL that pod's sidecar advertises (its
  ``--advertise-url http://$(POD_IP):PORT`` expanded by the kubelet, then repaired) are the same
  bracketed URL, for any IPv4 or IPv6 pod IP, port-mapped or not;
* a Prometheus URL with credentials and an IPv6 host is shown without the credentials and keeps its
  brackets (it lost them: ``http://fd00::9:9090``, which is no URL);
* ``prefixfleet operator run`` accepts a bracketed liveness host (``http://[::]:8080/healthz``, how
  an IPv6-only cluster's probe reaches the pod) and refuses an unbracketed IPv6 ``--redis`` or
  ``--prometheus`` with one line naming the bracketed URL.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixfleet.operator.models import FleetSpec
from prefixfleet.operator.planner import FleetRef, ObservedPod, pod_url, replica_template
from prefixfleet.operator.prometheus_source import PrometheusSource
from prefixfleet.router.addresses import bracket_ipv6_url

PREFIXFLEET = str(Path(sys.executable).parent / "prefixfleet")
SPEC = FleetSpec.model_validate({"model": {"name": "m", "revision": "r1"}, "engine": {"kind": "emulator"}})


def advertise_arg() -> str:
    template, _ = replica_template(FleetRef(name="six", namespace="prod"), SPEC, "redis://redis:6379/0")
    sidecar = next(c for c in template["spec"]["containers"] if c["name"] == "sidecar")
    args = sidecar["args"]
    return args[args.index("--advertise-url") + 1]


@given(ip=st.ip_addresses().map(str), mapped=st.booleans())
def test_the_published_member_url_is_the_url_the_sidecar_advertises(ip: str, mapped: bool) -> None:
    port = SPEC.sidecar.port
    pod = ObservedPod(
        name="six-replica-0", phase="Running", ready=True, pod_ip=ip, port_map={port: 41001} if mapped else {}
    )
    published = pod_url(pod, port)
    assert published is not None
    if not mapped:  # the kubelet's $(POD_IP) expansion, then the sidecar's repair
        assert bracket_ipv6_url(advertise_arg().replace("$(POD_IP)", ip)) == published
    host = published.removeprefix("http://").rpartition(":")[0]
    assert host == (f"[{ip}]" if ":" in ip else ip)


def test_member_urls_for_ipv6_pods() -> None:
    pod = ObservedPod(name="a", phase="Running", ready=True, pod_ip="fd00::1:2", port_map={8100: 41001})
    assert pod_url(pod, 8100) == "http://[fd00::1:2]:41001"
    assert pod_url(ObservedPod(name="b", phase="Pending", ready=False, pod_ip=None), 8100) is None


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://admin:s3cret@[fd00::9]:9090", "http://[fd00::9]:9090"),
        ("http://admin:s3cret@[fd00::9]/prom", "http://[fd00::9]/prom"),
        ("http://admin:s3cret@10.0.0.9:9090", "http://10.0.0.9:9090"),
        ("http://[fd00::9]:9090", "http://[fd00::9]:9090"),
    ],
)
def test_a_prometheus_url_is_shown_without_credentials_and_with_its_brackets(url: str, shown: str) -> None:
    source = PrometheusSource(url)
    try:
        assert source.display_url == shown
    finally:
        source.close()


def operator_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PREFIXFLEET, "operator", "run", *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_the_operator_accepts_a_bracketed_liveness_host() -> None:
    # the liveness URL is checked first: the refusal of the later --redis shows it passed
    result = operator_run("--liveness", "http://[::]:8080/healthz", "--redis", "redis://::1:6379/0")
    assert result.returncode == 2 and "--liveness" not in result.stderr
    assert "--redis 'redis://::1:6379/0': an IPv6 address goes in brackets: write redis://[::1]:6379/0" in (
        result.stderr
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--prometheus", "http://fd00::9:9090"], "--prometheus 'http://fd00::9:9090': an IPv6 address goes"
         " in brackets: write http://[fd00::9]:9090"),
        (["--liveness", "http://[nothing]:8080/healthz"], "[nothing] is not an IPv6 address"),
        (["--liveness", "http://::1:8080/healthz"], "--liveness must look like http://HOST:PORT/PATH"),
        # isdigit() takes '²', int() does not: refused by name, not a traceback
        (["--redis", "redis://h:²/0"], "--redis 'redis://h:²/0': the port '²' is not a number in 1..65535"),
        (["--redis", "redis://h:٣/0"], "--redis 'redis://h:٣/0': the port '٣' is not a number"),
    ],
)  # fmt: skip
def test_the_operator_refuses_unreadable_addresses_in_one_line(args: list[str], says: str) -> None:
    result = operator_run(*args)
    assert result.returncode == 2 and says in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
