"""The emulated API server speaks to the real clients: the `kubernetes` client and kubectl 1.37."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import kubernetes
import pytest
import yaml
from kubernetes.client.rest import ApiException

from tests.k8s.apiserver import label_selector_matches, parse_resource_path, strategic_merge_patch
from tests.k8s.cluster import CRD_FILE, EmulatedCluster, wait_for

GROUP, VERSION, PLURAL = "prefixfleet.io", "v1alpha1", "prefixcachefleets"


def fleet_manifest(name: str, replicas: int = 1) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PrefixCacheFleet",
        "metadata": {"name": name},
        "spec": {"model": {"name": "emulated-llm"}, "engine": {"kind": "emulator"}, "replicas": replicas},
    }


@pytest.fixture
def api(cluster: EmulatedCluster) -> kubernetes.client.ApiClient:
    cluster.install_crd()
    return kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))


def test_paths_parse_like_the_real_server() -> None:
    assert parse_resource_path("/api/v1/namespaces").plural == "namespaces"
    default = parse_resource_path("/api/v1/namespaces/default")
    assert (default.plural, default.name, default.namespace) == ("namespaces", "default", None)
    scale = parse_resource_path(f"/apis/{GROUP}/{VERSION}/namespaces/ns1/{PLURAL}/f/scale")
    assert (scale.namespace, scale.plural, scale.name, scale.subresource) == ("ns1", PLURAL, "f", "scale")
    assert parse_resource_path("/apis/apps/v1") is None  # discovery


def test_selectors_and_strategic_merge() -> None:
    labels = {"app": "x", "role": "replica"}
    assert label_selector_matches("app=x,role in (replica,router)", labels)
    assert not label_selector_matches("app=x,role!=replica", labels)
    assert label_selector_matches("!missing,app", labels)
    merged = strategic_merge_patch(
        {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b"}]}},
        {"spec": {"containers": [{"name": "a", "image": "2"}]}},
    )
    assert merged["spec"]["containers"] == [{"name": "a", "image": "2"}, {"name": "b"}]


def test_created_objects_get_identity_namespace_and_201(api: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api)
    created = core.create_namespaced_config_map("default", {"metadata": {"name": "c1"}, "data": {"a": "1"}})
    assert created.metadata.uid and created.metadata.resource_version and created.metadata.creation_timestamp
    assert created.metadata.namespace == "default"
    custom = kubernetes.client.CustomObjectsApi(api)
    fleet = custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, fleet_manifest("f1"))
    assert fleet is not None and fleet["metadata"]["namespace"] == "default"  # 201 with the body
    with pytest.raises(ApiException) as conflict:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, fleet_manifest("f1"))
    assert conflict.value.status == 409


def test_generate_name_patch_bumps_version_and_noop_does_not(api: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api)
    e1 = core.create_namespaced_event("default", {"metadata": {"generateName": "ev-"}, "involvedObject": {}})
    e2 = core.create_namespaced_event("default", {"metadata": {"generateName": "ev-"}, "involvedObject": {}})
    assert e1.metadata.name != e2.metadata.name and e1.metadata.name.startswith("ev-")
    cm = core.create_namespaced_config_map("default", {"metadata": {"name": "c2"}, "data": {"a": "1"}})
    patched = core.patch_namespaced_config_map("c2", "default", {"data": {"a": "2"}})
    assert int(patched.metadata.resource_version) > int(cm.metadata.resource_version)
    again = core.patch_namespaced_config_map("c2", "default", {"data": {"a": "2"}})
    assert again.metadata.resource_version == patched.metadata.resource_version


def test_replace_with_stale_version_conflicts(api: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api)
    cm = core.create_namespaced_config_map("default", {"metadata": {"name": "c3"}, "data": {"a": "1"}})
    cm.data = {"a": "replaced"}
    replaced = core.replace_namespaced_config_map("c3", "default", cm)
    assert replaced.data == {"a": "replaced"}
    cm.data = {"a": "stale"}
    with pytest.raises(ApiException) as stale:
        core.replace_namespaced_config_map("c3", "default", cm)  # still carries the old resourceVersion
    assert stale.value.status == 409


def test_namespaces_are_listed_and_default_exists(api: kubernetes.client.ApiClient) -> None:
    names = [ns.metadata.name for ns in kubernetes.client.CoreV1Api(api).list_namespace().items]
    assert "default" in names


def test_status_subresource_and_scale(api: kubernetes.client.ApiClient) -> None:
    custom = kubernetes.client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, fleet_manifest("f2", 2))
    # The main endpoint ignores status; /status takes only status.
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "f2", {"status": {"replicas": 9}}
    )
    assert "status" not in custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "f2")
    custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        "f2",
        {"status": {"replicas": 2, "selector": "a=b"}, "spec": {"replicas": 7}},
    )
    scale = custom.get_namespaced_custom_object_scale(GROUP, VERSION, "default", PLURAL, "f2")
    assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"]["replicas"] == 2 and scale["status"] == {"replicas": 2, "selector": "a=b"}
    custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, "default", PLURAL, "f2", {"spec": {"replicas": 5}}
    )
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "f2")
    assert obj["spec"]["replicas"] == 5 and obj["metadata"]["generation"] == 2


def test_finalizers_hold_deletion_until_removed(api: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespaced_config_map("default", {"metadata": {"name": "held", "finalizers": ["x/y"]}})
    core.delete_namespaced_config_map("held", "default")
    held = core.read_namespaced_config_map("held", "default")
    assert held.metadata.deletion_timestamp is not None
    core.patch_namespaced_config_map("held", "default", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_config_map("held", "default")
    assert gone.value.status == 404


def test_watch_resumes_from_a_resource_version_with_selectors(api: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(api)
    listing = core.list_namespaced_pod("default")
    events: list[tuple[str, str]] = []

    def consume() -> None:
        w = kubernetes.watch.Watch()
        for ev in w.stream(
            core.list_namespaced_pod,
            "default",
            resource_version=listing.metadata.resource_version,
            label_selector="role=replica",
            timeout_seconds=5,
        ):
            events.append((ev["type"], ev["object"].metadata.name))
            if ev["type"] == "DELETED":
                w.stop()

    thread = threading.Thread(target=consume)
    thread.start()
    pod = {
        "metadata": {"name": "p1", "labels": {"role": "replica"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    core.create_namespaced_pod("default", pod)
    core.create_namespaced_pod(
        "default", {**pod, "metadata": {"name": "other", "labels": {"role": "router"}}}
    )
    core.delete_namespaced_pod("p1", "default")
    thread.join(10)
    assert events == [("ADDED", "p1"), ("DELETED", "p1")]


def test_kubectl_apply_get_scale_delete(cluster: EmulatedCluster) -> None:
    cluster.install_crd()
    cluster.apply(json.dumps(fleet_manifest("kf", 1)))
    got = cluster.kubectl_json("get", "pcf", "kf")
    assert got["kind"] == "PrefixCacheFleet" and got["metadata"]["uid"]
    listing = cluster.kubectl_json("get", "pcf")
    assert listing["kind"] == "List" or listing["kind"].endswith("List")
    table = cluster.kubectl("get", "pcf").stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "DESIRED", "READY"] and table[1].split()[:2] == ["kf", "1"]
    assert "scaled" in cluster.kubectl("scale", "pcf/kf", "--replicas=3").stdout
    assert cluster.kubectl_json("get", "prefixcachefleet", "kf")["spec"]["replicas"] == 3
    cluster.kubectl("delete", "pcf", "kf", "--timeout=15s")
    assert "No resources found" in cluster.kubectl("get", "pcf").stderr


def test_kubectl_core_kinds_and_lists(cluster: EmulatedCluster, tmp_path: Path) -> None:
    manifest = tmp_path / "objs.yaml"
    manifest.write_text(
        yaml.safe_dump_all(
            [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "cm1", "labels": {"t": "1"}},
                    "data": {"k": "v"},
                },
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": "svc1"},
                    "spec": {"ports": [{"port": 80}]},
                },
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": {"name": "d1"},
                    "spec": {
                        "replicas": 2,
                        "selector": {"matchLabels": {"a": "b"}},
                        "template": {
                            "metadata": {"labels": {"a": "b"}},
                            "spec": {"containers": [{"name": "c", "image": "i"}]},
                        },
                    },
                },
            ]
        )
    )
    cluster.apply(manifest)
    assert [i["metadata"]["name"] for i in cluster.kubectl_json("get", "cm", "-l", "t=1")["items"]] == ["cm1"]
    cluster.kubectl("scale", "deployment/d1", "--replicas=1")
    assert cluster.kubectl_json("get", "deploy", "d1")["spec"]["replicas"] == 1
    cluster.kubectl("delete", "-f", str(manifest), "--timeout=15s")
    wait_for(lambda: not cluster.api.objects("configmaps"), 5, what="configmaps gone")
    assert "No resources found" in cluster.kubectl("get", "svc,deploy,cm").stderr


def test_crd_applied_through_kubectl_is_served(cluster: EmulatedCluster) -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    cluster.install_crd()
    resources = cluster.kubectl("api-resources", "--api-group", GROUP).stdout
    assert PLURAL in resources and crd["spec"]["names"]["shortNames"][0] in resources


def test_watch_list_streams_json_and_ends_initial_events_with_a_bookmark(cluster: EmulatedCluster) -> None:
    params = {"watch": "true", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
              "allowWatchBookmarks": "true", "timeoutSeconds": "1"}  # fmt: skip
    with httpx.stream("GET", f"{cluster.api.url}/api/v1/namespaces", params=params, timeout=10) as resp:
        assert resp.headers["content-type"].startswith("application/json")
        events = [json.loads(line) for line in resp.iter_lines() if line.strip()]
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert events[0]["object"]["metadata"]["name"] == "default"
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_core_discovery_names_the_v1_group_version(cluster: EmulatedCluster) -> None:
    core = httpx.get(f"{cluster.api.url}/api/v1", timeout=5).json()
    assert core["groupVersion"] == "v1"
    scale = next(r for r in httpx.get(f"{cluster.api.url}/apis/apps/v1", timeout=5).json()["resources"]
                 if r["name"] == "deployments/scale")  # fmt: skip
    assert scale["kind"] == "Scale" and "shortNames" not in scale


def test_invalid_custom_resources_are_refused_naming_the_field(cluster: EmulatedCluster) -> None:
    cluster.install_crd()
    bad = fleet_manifest("bad")
    bad["spec"]["engine"]["kind"] = "tpu"
    refused = cluster.kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(bad), check=False)
    assert refused.returncode != 0 and "spec.engine.kind" in refused.stderr
    cluster.apply(json.dumps(fleet_manifest("good")))
    defaulted = cluster.kubectl_json("get", "pcf", "good")
    assert defaulted["spec"]["router"]["policy"]  # schema defaults are filled in, as by the API server
    scaled = cluster.kubectl("scale", "pcf/good", "--replicas=-1", check=False)
    assert scaled.returncode != 0
