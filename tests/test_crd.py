"""The PrefixCacheFleet CRD: generated from the models, structural, and refusing nonsense by name."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from prefixfleet.operator import models
from prefixfleet.operator.crd import build_crd, crd_paths, render_crd_yaml, render_field_reference
from prefixfleet.operator.crd_admission import admission_errors, apply_defaults, crd_schema
from prefixfleet.router.policies import POLICIES

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
K8S_VERSION = "1.33.0"


def fleet(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": {"name": "m"}, "engine": {"kind": "emulator"}}
    base.update(spec)
    return {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": "f", "namespace": "default"},
        "spec": base,
    }


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return build_crd()


# ------------------------------------------------------------------ generation and drift


@pytest.mark.parametrize("path", crd_paths(ROOT), ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_crd_is_what_the_models_generate(path: Path) -> None:
    assert path.exists(), f"{path} missing: run `prefixfleet operator crd -o {path}`"
    assert path.read_text() == render_crd_yaml(), (
        f"{path.relative_to(ROOT)} drifted from operator/models.py: "
        f"run `prefixfleet operator crd -o {path.relative_to(ROOT)}`"
    )


def test_docs_field_reference_is_what_the_models_generate() -> None:
    text = (ROOT / "docs" / "operator.md").read_text()
    begin = text.index("<!-- BEGIN field reference")
    body = text[text.index("\n", begin) + 1 : text.index("<!-- END field reference -->")]
    assert body == render_field_reference(), (
        "docs/operator.md: regenerate with `prefixfleet operator crd --markdown`"
    )


def test_cli_prints_the_same_crd(capsys: pytest.CaptureFixture[str]) -> None:
    from prefixfleet.cli import main

    assert main(["operator", "crd"]) == 0
    assert capsys.readouterr().out == render_crd_yaml()


def test_cli_refuses_an_output_in_a_missing_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from prefixfleet.cli import main

    assert main(["operator", "crd", "--output", str(tmp_path / "nope" / "crd.yaml")]) == 2
    assert "--output" in capsys.readouterr().err


def test_crd_is_a_valid_kubernetes_object(crd: dict[str, Any]) -> None:
    assert kubernetes_validate.validate(crd, K8S_VERSION, strict=True)


def test_crd_names_scope_and_subresources(crd: dict[str, Any]) -> None:
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "prefixcachefleets.prefixfleet.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "PrefixCacheFleet"
    assert spec["names"]["shortNames"] == ["pcf"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Desired"] == ".spec.replicas"
    assert columns["Ready"] == ".status.readyReplicas"
    assert columns["Hit rate"] == ".status.hitRate"
    assert columns["Policy"] == ".spec.router.policy"
    assert columns["Age"] == ".metadata.creationTimestamp"


def _walk(node: Any, path: str = ""):
    if isinstance(node, dict):
        yield path, node
        for key, sub in node.get("properties", {}).items():
            yield from _walk(sub, f"{path}.{key}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                yield from _walk(node[key], f"{path}[{key}]")


def test_schema_is_structural(crd: dict[str, Any]) -> None:
    """Kubernetes refuses non-structural schemas; check the rules pydantic's output would break."""
    for path, node in _walk(crd_schema(crd)):
        where = path or "<root>"
        assert "$ref" not in node and "title" not in node and "$defs" not in node, where
        assert "allOf" not in node and "oneOf" not in node, where
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") is True, f"{where}: anyOf only as int-or-string"
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], where
            assert "type" not in node, where
        else:
            assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{where}: no type"
        assert not ("properties" in node and "additionalProperties" in node), where
        assert node.get("additionalProperties") is not False, where
        assert node.get("default", 0) is not None, f"{where}: null default"
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, where


def test_every_cel_rule_compiles_and_names_a_field(crd: dict[str, Any]) -> None:
    import celpy

    env = celpy.Environment()
    rules = [rule for _, node in _walk(crd_schema(crd)) for rule in node.get("x-kubernetes-validations", [])]
    assert len(rules) >= 4
    for rule in rules:
        env.compile(rule["rule"])  # raises on a syntax error
        assert rule["message"].startswith(("spec.", "env:")), rule["message"]


def test_quantities_are_int_or_string_and_free_form_objects_are_preserved(crd: dict[str, Any]) -> None:
    spec = crd_schema(crd)["properties"]["spec"]["properties"]
    requests = spec["engine"]["properties"]["resources"]["properties"]["requests"]
    assert requests["additionalProperties"]["x-kubernetes-int-or-string"] is True
    # podTemplate: Pod spec fields pass through; anything beside metadata and spec is an unknown field
    pod_template = spec["engine"]["properties"]["podTemplate"]
    assert pod_template["properties"]["spec"]["x-kubernetes-preserve-unknown-fields"] is True
    assert "x-kubernetes-preserve-unknown-fields" not in pod_template
    # kopf keeps its progress in status.kopf: it must survive pruning
    assert crd_schema(crd)["properties"]["status"]["x-kubernetes-preserve-unknown-fields"] is True


def test_enums_carry_every_engine_kind_and_policy(crd: dict[str, Any]) -> None:
    spec = crd_schema(crd)["properties"]["spec"]["properties"]
    assert spec["engine"]["properties"]["kind"]["enum"] == ["sglang", "vllm", "emulator"]
    assert spec["router"]["properties"]["policy"]["enum"] == list(models.ROUTING_POLICIES)
    # every policy the router registers can be chosen in a fleet (and vice versa)
    assert set(POLICIES) == set(models.ROUTING_POLICIES)


def test_schema_defaults_equal_the_model_defaults(crd: dict[str, Any]) -> None:
    """What the API server fills in is what the operator would assume: one source of defaults."""
    obj = fleet()
    defaulted = apply_defaults(crd_schema(crd), obj)["spec"]
    from_models = models.FleetSpec.model_validate(obj["spec"]).to_wire()
    # kind-dependent defaults (engine image and port, and the router's blockTokens: the engine's
    # block size) are filled by the models only, as are the sidecar's and gateway's images (the
    # operator's, at reconcile time: a schema default would be stored and outlive an upgrade)
    for key in ("image", "port"):
        from_models["engine"].pop(key)
    from_models["router"].pop("blockTokens")
    from_models["router"].pop("image")
    from_models["sidecar"].pop("image")
    assert defaulted == from_models


# ------------------------------------------------------------------ examples


def test_there_is_an_example_per_engine_kind() -> None:
    kinds = {yaml.safe_load(p.read_text())["spec"]["engine"]["kind"] for p in EXAMPLES}
    assert kinds == set(models.ENGINE_KINDS)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_passes_the_crd_schema_and_the_models(path: Path, crd: dict[str, Any]) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs, f"{path.name} is empty"
    for obj in docs:
        assert admission_errors(crd, obj) == []
        models.PrefixCacheFleet.model_validate(obj)


# ------------------------------------------------------------------ refusing nonsense, by name


def engine_args(kind: str, *args: str) -> dict[str, Any]:
    return {"engine": {"kind": kind, "args": list(args)}}


def pod_template(template: Any) -> dict[str, Any]:
    return {"engine": {"kind": "sglang", "podTemplate": template}}


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("negative replicas", {"replicas": -1}, "spec.replicas"),
    ("unknown engine kind", {"engine": {"kind": "tgi"}}, "spec.engine.kind"),
    ("unknown policy", {"router": {"policy": "random"}}, "spec.router.policy"),
    ("min above max", {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}, "spec.autoscaling.minReplicas"),
    (
        "replicas outside the autoscaling bounds",
        {"replicas": 9, "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 4}},
        "spec.replicas",
    ),
    (
        "a fractional GPU",
        {"engine": {"kind": "sglang", "resources": {"limits": {"nvidia.com/gpu": 0.5}}}},
        "gpu",
    ),
    (
        "a quantity that is no quantity",
        {"engine": {"kind": "vllm", "resources": {"requests": {"memory": "lots"}}}},
        "spec.engine.resources.requests.memory",
    ),
    (
        "two Redis URLs",
        {"redis": {"url": "redis://r:6379", "secretRef": {"name": "s", "key": "url"}}},
        "spec.redis",
    ),
    # the sidecar would exit at pod start on these (router/addresses.py authority_error)
    ("an unbracketed IPv6 Redis host", {"redis": {"url": "redis://::1:6379/0"}}, "spec.redis.url"),
    ("a Redis port out of range", {"redis": {"url": "redis://r:0/0"}}, "spec.redis.url"),
    (
        "an unbracketed IPv6 Prometheus host",
        {"prometheus": {"url": "http://fd00::9:9090"}},
        "spec.prometheus.url",
    ),
    ("a port out of range", {"router": {"port": 70000}}, "spec.router.port"),
    # past the bounds the operator's planners work within (models.MAX_REPLICAS, MIN_TARGET_LOAD, ...)
    ("a replica count with extra zeros", {"replicas": 100000000}, "spec.replicas"),
    (
        "a maxReplicas with extra zeros",
        {"autoscaling": {"maxReplicas": 10**9}},
        "spec.autoscaling.maxReplicas",
    ),
    (
        "a vanishing target load",
        {"autoscaling": {"targetLoad": 1e-310, "scaleDownLoad": 1e-311}},
        "targetLoad",
    ),
    ("a TTFT target of 0", {"autoscaling": {"targetTTFTSeconds": 0}}, "spec.autoscaling.targetTTFTSeconds"),
    ("a queue target of 0", {"autoscaling": {"targetQueueDepth": 0}}, "spec.autoscaling.targetQueueDepth"),
    ("a lead time of ages", {"autoscaling": {"leadTimeSeconds": 1e308}}, "spec.autoscaling.leadTimeSeconds"),
    ("the sidecar on the engine kind's default port", {"sidecar": {"port": 30000}}, "spec.sidecar.port"),
    ("the engine on the sidecar's port", {"engine": {"kind": "vllm", "port": 8100}}, "spec.sidecar.port"),
    ("the engine's port in its args", engine_args("sglang", "--port", "31000"), "spec.engine.args"),
    ("the engine's port=N in its args", engine_args("vllm", "--port=9000"), "spec.engine.args"),
    ("the engine's host in its args", engine_args("vllm", "--host", "0.0.0.0"), "spec.engine.args"),
    ("the engine's host=H in its args", engine_args("emulator", "--host=::"), "spec.engine.args"),
    ("a Unix socket for vLLM", engine_args("vllm", "--uds", "/tmp/v.sock"), "spec.engine.args"),
    # argparse (SGLang, vLLM) takes an unambiguous prefix for the option
    ("the engine's port, abbreviated", engine_args("sglang", "--por", "9000"), "spec.engine.args"),
    ("the engine's port=N, abbreviated", engine_args("vllm", "--po=9000"), "spec.engine.args"),
    ("the engine's host, abbreviated", engine_args("vllm", "--hos", "::"), "spec.engine.args"),
    ("a Unix socket, abbreviated", engine_args("vllm", "--ud=/tmp/v.sock"), "spec.engine.args"),
    ("a config file (sets host, port)", engine_args("sglang", "--config", "c.yaml"), "spec.engine.args"),
    ("a config file, =FILE", engine_args("vllm", "--config=/etc/v.yaml"), "spec.engine.args"),
    ("a config file, abbreviated", engine_args("vllm", "--conf", "/etc/v.yaml"), "spec.engine.args"),
    ("SGLang's metrics flag with =true", engine_args("sglang", "--enable-metrics=true"), "spec.engine.args"),
    (
        "SGLang's metrics flag with a value",
        engine_args("sglang", "--enable-metrics", "true"),
        "spec.engine.args",
    ),
    (
        "SGLang's metrics flag, value last",
        engine_args("sglang", "--tp", "2", "--enable-metrics", "1"),
        "spec.engine.args",
    ),
    (
        "a Pod field beside podTemplate.spec",
        pod_template({"nodeSelector": {"gpu": "h100"}}),
        "podTemplate.nodeSelector",
    ),
    (
        "podTemplate.spec not an object",
        pod_template({"spec": ["tolerations"]}),
        "spec.engine.podTemplate.spec",
    ),
    (
        "podTemplate containers not a list",
        pod_template({"spec": {"containers": {"name": "engine"}}}),
        "podTemplate.spec.containers",
    ),
    (
        "a podTemplate container without a name",
        pod_template({"spec": {"containers": [{"image": "busybox"}]}}),
        "podTemplate.spec.containers[0].name",
    ),
    (
        "a podTemplate container that is a string",
        pod_template({"spec": {"containers": ["engine"]}}),
        "podTemplate.spec.containers[0]",
    ),
    (
        "an added container without an image",
        pod_template({"spec": {"containers": [{"name": "log-shipper"}]}}),
        "podTemplate.spec.containers",
    ),
    (
        "an init container without an image",
        pod_template({"spec": {"initContainers": [{"name": "fetch"}]}}),
        "podTemplate.spec.initContainers",
    ),
    (
        "one container twice",
        pod_template({"spec": {"containers": [{"name": "engine"}, {"name": "engine"}]}}),
        "podTemplate.spec.containers",
    ),
    (
        "the operator's fleet label",
        pod_template({"metadata": {"labels": {"prefixfleet.io/fleet": "x"}}}),
        "podTemplate.metadata.labels",
    ),
    (
        "the operator's component label",
        pod_template({"metadata": {"labels": {"app.kubernetes.io/component": "gpu"}}}),
        "podTemplate.metadata.labels",
    ),
    (
        "a label value that is a number",
        pod_template({"metadata": {"labels": {"tier": 1}}}),
        "podTemplate.metadata.labels",
    ),
    (
        "the operator's annotation",
        pod_template({"metadata": {"annotations": {"prefixfleet.io/template-hash": "x"}}}),
        "podTemplate.metadata.annotations",
    ),
    ("a pod name in podTemplate", pod_template({"metadata": {"name": "mine"}}), "podTemplate.metadata.name"),
    ("a misspelt field", {"replica": 3}, "spec.replica"),
    ("no model", {"model": None}, "spec.model"),
]


@pytest.mark.parametrize(("spec", "field"), [(s, f) for _, s, f in INVALID], ids=[n for n, _, _ in INVALID])
def test_crd_refuses_nonsense_naming_the_field(spec: dict[str, Any], field: str, crd: dict[str, Any]) -> None:
    obj = fleet(**spec)
    if spec.get("model", "") is None:
        del obj["spec"]["model"]
    problems = admission_errors(crd, obj)
    assert problems, f"accepted: {spec}"
    assert any(field in p for p in problems), problems


@pytest.mark.parametrize(("spec", "field"), [(s, f) for _, s, f in INVALID], ids=[n for n, _, _ in INVALID])
def test_models_refuse_nonsense_naming_the_field(spec: dict[str, Any], field: str) -> None:
    body = copy.deepcopy(fleet(**spec)["spec"])
    if body.get("model", "") is None:
        del body["model"]
    with pytest.raises(models.InvalidFleetSpec) as err:
        models.validate_spec(body)
    assert field in str(err.value)


@pytest.mark.parametrize(
    ("arg", "index", "says"),
    [
        ("--por", 2, "'--por' (argparse reads it as --port) would move the engine off 127.0.0.1:30000"),
        ("--hos=::", 2, "'--hos=::' (argparse reads it as --host) would move the engine off"),
        ("--config", 2, "'--config': a config file can set the engine's --host and --port, which the"),
        ("--confi=c.yaml", 2, "'--confi=c.yaml' (argparse reads it as --config): a config file can set"),
    ],
)
def test_a_refused_engine_arg_is_named_by_index_with_the_flag_argparse_reads(
    arg: str, index: int, says: str
) -> None:
    with pytest.raises(models.InvalidFleetSpec) as err:
        models.validate_spec(fleet(engine={"kind": "sglang", "args": ["--tp", "2", arg, "x"]})["spec"])
    assert f"spec.engine.args[{index}]: {says}" in str(err.value)


def test_the_api_server_refuses_a_listen_or_config_engine_arg_naming_the_field(crd: dict[str, Any]) -> None:
    # the rules' static messages: an index needs string(int) in a messageExpression, which the API
    # server's cost estimate cannot bound (the whole CRD would be refused); the models name the index
    obj = fleet(engine={"kind": "sglang", "args": ["--tp", "2", "--hos", "::", "--conf=c.yaml"]})
    errors = admission_errors(crd, obj)
    assert [e.split(" must not ")[0] for e in errors] == ["spec.engine.args", "spec.engine.args"]
    assert "set the engine's --host, --port or --uds" in errors[0] and "pass --config" in errors[1]


def test_engine_args_that_only_resemble_listen_flags_are_accepted(crd: dict[str, Any]) -> None:
    # '--p', '--h' and '--c' are shorter than the refused abbreviations (ambiguous in the engines,
    # which refuse them themselves); longer options that merely start like a refused flag are others
    args = ["--nccl-port", "5000", "--port-range", "1", "--dist-init-addr", "10.0.0.1:5000", "--hostname-x",
            "--p", "1", "--h", "--c", "--config-format", "hf", "--context-length", "8192"]  # fmt: skip
    obj = fleet(engine={"kind": "sglang", "args": args})
    assert admission_errors(crd, obj) == []
    assert models.validate_spec(obj["spec"]).engine.args == args


@pytest.mark.parametrize(
    "args", [["--enable-metrics"], ["--enable-metrics", "--tp", "2"], ["--tp", "2", "--enable-metrics"]]
)
def test_sglang_gets_enable_metrics_once_however_the_user_wrote_it(
    args: list[str], crd: dict[str, Any]
) -> None:
    from prefixfleet.operator import planner

    obj = fleet(engine={"kind": "sglang", "args": args})
    assert admission_errors(crd, obj) == []
    _, command_args = planner.engine_command(models.validate_spec(obj["spec"]))
    assert command_args.count("--enable-metrics") == 1
    assert not any(a.startswith("--enable-metrics=") for a in command_args)


def test_other_engines_keep_their_own_metrics_flags(crd: dict[str, Any]) -> None:
    # only SGLang's flag is the operator's; the emulator and vLLM take args as given
    obj = fleet(engine={"kind": "vllm", "args": ["--enable-metrics", "true"]})
    assert admission_errors(crd, obj) == []
    models.validate_spec(obj["spec"])


def test_a_pod_template_that_merges_cleanly_is_accepted_and_reaches_the_pod(crd: dict[str, Any]) -> None:
    from prefixfleet.operator import planner

    template = {
        "metadata": {
            "labels": {"team": "ml", "app.kubernetes.io/part-of": "chat"},
            "annotations": {"a": "b"},
        },
        "spec": {
            "nodeSelector": {"gpu": "h100"},
            "containers": [
                {"name": "engine", "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]},
                {"name": "log-shipper", "image": "busybox:1.36", "args": ["tail", "-f", "/dev/null"]},
            ],
            "initContainers": [{"name": "fetch", "image": "busybox:1.36"}],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        },
    }
    obj = fleet(**pod_template(template))
    assert admission_errors(crd, obj) == []
    spec = models.validate_spec(obj["spec"])
    ref = planner.FleetRef(name="f", namespace="default", uid="uid")
    pod_template_out, _ = planner.replica_template(ref, spec, "redis://r:6379/0")
    assert [c["name"] for c in pod_template_out["spec"]["containers"]] == ["engine", "sidecar", "log-shipper"]
    assert pod_template_out["metadata"]["labels"]["team"] == "ml"
    assert pod_template_out["spec"]["nodeSelector"] == {"gpu": "h100"}


def test_the_sidecar_may_take_a_port_the_engine_does_not_use(crd: dict[str, Any]) -> None:
    obj = fleet(engine={"kind": "vllm"}, sidecar={"port": 30000})  # vLLM's default is 8000
    assert admission_errors(crd, obj) == []
    assert models.validate_spec(obj["spec"]).engine.port == 8000


BAD_FLEET_NAMES = {
    "a dot (the <name>-router Service must be a DNS-1035 label)": "chat.v2",
    "a leading digit (same)": "1chat",
    "upper case": "Chat",
    "64 characters (label values hold 63)": "a" * 64,
    "48 characters (child names would be truncated)": "a" * 48,
}


@pytest.mark.parametrize("name", BAD_FLEET_NAMES.values(), ids=BAD_FLEET_NAMES.keys())
def test_crd_refuses_a_fleet_name_its_children_cannot_carry(name: str, crd: dict[str, Any]) -> None:
    obj = fleet()
    obj["metadata"]["name"] = name
    problems = admission_errors(crd, obj)
    assert problems and all(p.startswith("metadata.name: ") for p in problems), problems


def test_the_longest_accepted_fleet_name_gives_valid_child_names_and_labels(crd: dict[str, Any]) -> None:
    from prefixfleet.operator import planner

    obj = fleet()
    obj["metadata"].update(name="a" * 47, labels={"team": "ml"}, annotations={"note": "x"})
    assert admission_errors(crd, obj) == []  # metadata's other fields are not unknown fields
    ref = planner.FleetRef(name=obj["metadata"]["name"], namespace="default", uid="uid")
    spec = models.validate_spec(obj["spec"])
    template, template_hash = planner.replica_template(ref, spec, "redis://r:6379/0")
    pod = planner.replica_pod(ref, template, template_hash, 0)
    children = [pod, *planner.desired_children(ref, spec, "")]
    dns_1035 = re.compile(models.FLEET_NAME_PATTERN)
    for child in children:
        meta = child["metadata"]
        assert len(meta["name"]) <= 63 and dns_1035.match(meta["name"]), meta["name"]
        assert all(len(value) <= 63 for value in meta["labels"].values()), meta["labels"]


def test_the_longest_accepted_fleet_name_in_the_longest_namespace_has_a_redis_fleet() -> None:
    from prefixfleet.operator import planner
    from prefixfleet.router.keys import FleetKeys, validate_fleet_name

    # A namespace is a DNS-1123 label of up to 63 characters; the Redis fleet is <namespace>.<name>.
    ref = planner.FleetRef(name="a" * models.FLEET_NAME_MAX_LENGTH, namespace="n" * 63, uid="uid")
    spec = models.validate_spec(fleet()["spec"])
    template, _ = planner.replica_template(ref, spec, "redis://r:6379/0")
    gateway = next(c for c in planner.desired_children(ref, spec, "") if c["kind"] == "Deployment")
    containers = [*template["spec"]["containers"], *gateway["spec"]["template"]["spec"]["containers"]]
    fleets = [c["args"][c["args"].index("--fleet") + 1] for c in containers if "--fleet" in c["args"]]
    assert len(fleets) == 2  # the sidecar's and the gateway's, which their CLIs validate
    assert all(validate_fleet_name(f) == ref.redis_fleet for f in fleets)
    assert FleetKeys(ref.redis_fleet).members.startswith(f"pf:{ref.namespace}.{ref.name}:")


def test_two_accepted_fleet_names_never_share_a_child_name() -> None:
    from prefixfleet.operator import planner

    stem = "a" * (models.FLEET_NAME_MAX_LENGTH - 1)
    one, two = (planner.FleetRef(name=stem + end, namespace="default", uid=end) for end in "bc")
    assert planner.router_name(one) != planner.router_name(two)
    for index in (0, 9_999_999):
        assert planner.replica_name(one, index) != planner.replica_name(two, index)


def test_status_with_kopf_progress_and_conditions_is_accepted(crd: dict[str, Any]) -> None:
    obj = fleet()
    obj["status"] = {
        "kopf": {"progress": {"create_fleet": {"started": "2026-01-01T00:00:00Z"}}},
        "replicas": 2,
        "readyReplicas": 1,
        "selector": "prefixfleet.io/fleet=f",
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "ReplicasNotReady",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        "hotPrefixes": [{"hash": "9f2c", "tokens": 512, "rate": 3.5, "holders": ["f-0"]}],
        "hitRate": 0.8,
    }
    assert admission_errors(crd, obj) == []
    status = models.FleetStatus.model_validate(obj["status"])
    assert status.condition("Ready").reason == "ReplicasNotReady"
    assert status.to_wire()["kopf"] == obj["status"]["kopf"]


# ------------------------------------------------------------------ prefixfleet operator validate


def test_validate_command_accepts_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    from prefixfleet.cli import main

    assert main(["operator", "validate", *map(str, EXAMPLES)]) == 0
    assert capsys.readouterr().out.count(": ok") == len(EXAMPLES)


def test_validate_command_names_every_bad_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from prefixfleet.cli import main

    bad = [
        fleet(replicas=-1, engine={"kind": "tgi"}),
        fleet(autoscaling={"minReplicas": 5, "maxReplicas": 2}),
        fleet(router={"policy": "sglang_cache_aware", "policyParams": {"cacheThreshold": 0.3}}),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other"}},
    ]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump_all(bad))
    assert main(["operator", "validate", str(path)]) == 1
    out = capsys.readouterr().out
    for field in (
        "spec.replicas",
        "spec.engine.kind",
        "spec.autoscaling.minReplicas",
        "policyParams.cacheThreshold",
    ):
        assert field in out
    assert "skipped a ConfigMap" in out


def test_validate_command_refuses_unreadable_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from prefixfleet.cli import main

    assert main(["operator", "validate", str(tmp_path / "missing.yaml")]) == 2
    (tmp_path / "broken.yaml").write_text("spec: [unclosed")
    assert main(["operator", "validate", str(tmp_path / "broken.yaml")]) == 2
    assert "not valid YAML" in capsys.readouterr().err
