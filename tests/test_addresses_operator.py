"""The operator's addresses on an IPv6 (or IPv6-first dual-stack) cluster.

Specification:
* the member URL the operator publishes for a pod and the URL that pod's sidecar advertises (its
  ``--advertise-url http://$(POD_IP):PORT`` expanded by the kubelet, then repaired) are the same
  bracketed URL, for any IPv4 or IPv6 pod IP, port-mapped or not;
* a Prometheus URL with credentials and an IPv6 host is shown without the credentials and keeps its
  brackets (it lost them: ``http://fd00::9:9090``, which is no URL);
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixfleet.operator.models import FleetSpec
from prefixfleet.operator.planner import FleetRef, ObservedPod, pod_url, replica_template
from prefixfleet.operator.prometheus_source import PrometheusSource
from prefixfleet.router.addresses import bracket_ipv6_url

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
