"""The CRD's CEL rules, run by a real CEL implementation and held against the models.

No API server runs here, so the rules (``x-kubernetes-validations``) are evaluated by cel-python
(``celpy``, the pure-Python CEL of the cel-spec) the way kube-apiserver (cel-go) evaluates them:

- every rule of the generated CRD is found by walking its schema (a new rule is covered without
  touching this file); each rule and messageExpression must compile, call only functions that
  Kubernetes 1.28's CEL environment has (the chart's ``kubeVersion``), select only fields the
  schema declares (the API server type-checks rules against the schema and refuses the CRD
  otherwise; cel-python does not type-check), and its ``fieldPath`` must name a declared field;
- ``self`` is built from the schema as the API server builds it: ``number`` fields are doubles even
  when written as integers, fields the schema does not declare are invisible, and Kubernetes 1.28
  has no cross-type numeric comparison (cel-python refuses ``int < double`` too);
- a differential property test: specs generated around the boundaries the rules guard are judged by
  the API server's steps (defaults, OpenAPI schema with RE2 patterns, then every CEL rule) and by the
  models (``operator/models.py``); both must accept or both refuse. A refusing rule's
  messageExpression, where it has one, must name the refused item as the models do (the engine
  listen/config rules have none: an index needs ``string(int)``, which the API server's cost
  estimate cannot bound, tests/test_blocktokens_review_cel_cost.py).

Kubernetes' own extension functions that cel-python lacks are provided below, implemented to the
Kubernetes list and strings library documentation (only the forms the rules use).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from functools import cache
from typing import Any

import celpy
import jsonschema
import pytest
import re2
from celpy import celtypes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lark import Token, Tree

from prefixfleet.operator import models
from prefixfleet.operator.crd import build_crd
from prefixfleet.operator.crd_admission import apply_defaults, crd_schema
from prefixfleet.router.addresses import authority_error

pytestmark = pytest.mark.slow

Schema = dict[str, Any]

# ------------------------------------------------------------------ Kubernetes' CEL environment

# Functions and macros in Kubernetes 1.28's CEL environment (the chart's kubeVersion), from
# https://kubernetes.io/docs/reference/using-api/cel/: the CEL standard library, the cel-go strings
# extension version 1, and the Kubernetes list, regex and URL libraries. The quantity library,
# optional types and cross-type numeric comparisons arrived in 1.29: not listed.
KUBERNETES_1_28_FUNCTIONS = frozenset(
    {
        # macros
        "has", "all", "exists", "exists_one", "map", "filter",
        # standard library
        "size", "contains", "startsWith", "endsWith", "matches", "int", "uint", "double", "string",
        "bytes", "bool", "type", "dyn", "duration", "timestamp", "getDate", "getDayOfMonth",
        "getDayOfWeek", "getDayOfYear", "getFullYear", "getMonth", "getHours", "getMilliseconds",
        "getMinutes", "getSeconds",
        # cel-go strings extension, version 1
        "charAt", "indexOf", "lastIndexOf", "lowerAscii", "upperAscii", "replace", "split", "join",
        "substring", "trim",
        # Kubernetes list library
        "isSorted", "sum", "min", "max",
        # Kubernetes regex and URL libraries
        "find", "findAll", "isURL", "url", "getScheme", "getHost", "getHostname", "getPort",
        "getEscapedPath", "getQuery",
    }
)  # fmt: skip
MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})


def _index_of(target: Any, item: Any) -> celtypes.IntType:
    """``<list>.indexOf(<T>)`` (Kubernetes list library) and ``<string>.indexOf(<string>)`` (strings
    extension): index of the first equal element or substring (in code points), -1 if none."""
    if isinstance(target, str):
        return celtypes.IntType(target.find(item))
    return celtypes.IntType(next((i for i, v in enumerate(target) if v == item), -1))


def _last_index_of(target: Any, item: Any) -> celtypes.IntType:
    """``lastIndexOf``: as ``indexOf``, the last occurrence."""
    if isinstance(target, str):
        return celtypes.IntType(target.rfind(item))
    found = [i for i, v in enumerate(target) if v == item]
    return celtypes.IntType(found[-1] if found else -1)


def _substring(target: Any, start: Any, end: Any = None) -> celtypes.StringType:
    """``<string>.substring(start[, end])`` (strings extension), in code points."""
    return celtypes.StringType(target[int(start) : None if end is None else int(end)])


KUBERNETES_EXTENSIONS = {"indexOf": _index_of, "lastIndexOf": _last_index_of, "substring": _substring}
CELPY_FUNCTIONS = frozenset(celpy.evaluation.base_functions) | MACROS | {"has"}

ENV = celpy.Environment()


@cache
def program(expression: str) -> celpy.Runner:
    return ENV.program(ENV.compile(expression), functions=KUBERNETES_EXTENSIONS)


def to_cel(schema: Schema, value: Any) -> Any:
    """``value`` as the API server hands it to CEL: typed by the schema, undeclared fields left out."""
    if isinstance(value, dict):
        props, extra = schema.get("properties", {}), schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:  # preserved unknown fields are not accessible in CEL
                out[celtypes.StringType(key)] = to_cel(sub, item)
        return celtypes.MapType(out)
    if isinstance(value, list):
        return celtypes.ListType([to_cel(schema.get("items", {}), item) for item in value])
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int) and schema.get("type") == "number":
        return celtypes.DoubleType(value)  # a number written as 1 is the double 1.0
    return celpy.json_to_cel(value)


# ------------------------------------------------------------------ the rules, found in the CRD

CRD = build_crd()
SCHEMA = crd_schema(CRD)


def schema_rules(node: Schema, path: str = "") -> Iterator[tuple[str, Schema, dict[str, str]]]:
    """(schema path, schema node, rule) for every x-kubernetes-validations entry."""
    for rule in node.get("x-kubernetes-validations", []):
        yield path or "<root>", node, rule
    for name, sub in node.get("properties", {}).items():
        yield from schema_rules(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from schema_rules(node[key], f"{path}[{key}]")


RULES = list(schema_rules(SCHEMA))
RULE_IDS = [f"{path}#{i}" for i, (path, _, _) in enumerate(RULES)]


def test_the_crd_has_cel_rules_to_check() -> None:
    assert len(RULES) >= 10  # the walk found them (a broken walk would make every test here vacuous)


@pytest.mark.parametrize(("path", "node", "rule"), RULES, ids=RULE_IDS)
def test_rule_and_message_expression_compile(path: str, node: Schema, rule: dict[str, str]) -> None:
    program(rule["rule"])
    if "messageExpression" in rule:
        program(rule["messageExpression"])
    # The API server refuses a blank message or one with a line break.
    assert rule["message"].strip() and "\n" not in rule["message"], path


def _called(tree: Tree) -> set[str]:
    names = set()
    for node in tree.iter_subtrees():
        if node.data == "member_dot_arg":
            names.add(str(node.children[1]))
        elif node.data in ("ident_arg", "dot_ident_arg"):
            names.add(str(node.children[0]))
    return names


@pytest.mark.parametrize(("path", "node", "rule"), RULES, ids=RULE_IDS)
def test_rule_calls_only_functions_kubernetes_has(path: str, node: Schema, rule: dict[str, str]) -> None:
    for expression in (rule["rule"], rule.get("messageExpression")):
        if expression is None:
            continue
        called = _called(ENV.compile(expression))
        assert called <= KUBERNETES_1_28_FUNCTIONS, f"{path}: not in Kubernetes 1.28's CEL: {called}"
        # ... and the evaluation here runs every one of them
        assert called <= CELPY_FUNCTIONS | set(KUBERNETES_EXTENSIONS), called - CELPY_FUNCTIONS


def _element_schema(owner: Schema) -> Schema:
    """What a macro's variable ranges over: list items, or map keys (strings)."""
    if owner.get("type") == "array":
        return owner.get("items", {})
    return {"type": "string"}


def _only_child(node: Tree) -> Tree | None:
    present = [c for c in node.children if c is not None]
    return present[0] if len(present) == 1 and isinstance(present[0], Tree) else None


def undeclared_fields(node: Tree | Token | None, scope: dict[str, Schema | None]) -> Iterator[str]:
    """Field selections the API server's type check refuses: a field the schema does not declare.

    Yields ``owner.field`` strings. ``scope`` maps variables (``self``, macro variables) to the
    schema they denote; None for a value of no schema (a literal, a call's result)."""
    yield from _walk_fields(node, scope, [None])


def _walk_fields(node: Any, scope: dict[str, Schema | None], out: list[Schema | None]) -> Iterator[str]:
    # out[0] receives the schema ``node`` denotes (None if it denotes no schema value)
    out[0] = None
    if not isinstance(node, Tree):
        return
    kind = node.data
    if kind == "ident":
        out[0] = scope.get(str(node.children[0]))
        return
    if kind == "member_dot":
        owner: list[Schema | None] = [None]
        yield from _walk_fields(node.children[0], scope, owner)
        name = str(node.children[1])
        if owner[0] is not None:
            props, extra = owner[0].get("properties"), owner[0].get("additionalProperties")
            if props is not None and name in props:
                out[0] = props[name]
            elif isinstance(extra, dict) and props is None:
                out[0] = extra  # a map's value
            else:
                yield name
        return
    if kind == "member_index":
        owner = [None]
        yield from _walk_fields(node.children[0], scope, owner)
        yield from _walk_fields(node.children[1], scope, [None])
        if owner[0] is not None:
            out[0] = owner[0].get("items") or owner[0].get("additionalProperties")
        return
    if kind == "member_dot_arg":
        owner = [None]
        yield from _walk_fields(node.children[0], scope, owner)
        args = list(node.children[2].children) if len(node.children) > 2 and node.children[2] else []
        if str(node.children[1]) in MACROS and args:
            variable = str(next(args[0].find_data("ident")).children[0])
            element = _element_schema(owner[0]) if owner[0] is not None else None
            scope = {**scope, variable: element}
            args = args[1:]
        for arg in args:
            yield from _walk_fields(arg, scope, [None])
        return
    child = _only_child(node)
    if child is not None:  # a wrapper (expr -> conditionalor -> ... -> primary) denotes its child
        yield from _walk_fields(child, scope, out)
        return
    for sub in node.children:
        yield from _walk_fields(sub, scope, [None])


@pytest.mark.parametrize(("path", "node", "rule"), RULES, ids=RULE_IDS)
def test_rule_selects_only_declared_fields(path: str, node: Schema, rule: dict[str, str]) -> None:
    for expression in (rule["rule"], rule.get("messageExpression")):
        if expression is not None:
            missing = list(undeclared_fields(ENV.compile(expression), {"self": node}))
            assert not missing, f"{path}: the schema declares no field {missing} (the API server refuses it)"


def test_the_declared_field_check_catches_an_undeclared_field() -> None:
    # the check above is no tautology: a typo, and a field of a free-form object, are caught
    engine = SCHEMA["properties"]["spec"]["properties"]["engine"]
    assert list(undeclared_fields(ENV.compile("has(self.arg)"), {"self": engine})) == ["arg"]
    env_item = engine["properties"]["env"]["items"]
    typo = "self.valueFrom.secretKeyRef == null"
    assert list(undeclared_fields(ENV.compile(typo), {"self": env_item})) == ["secretKeyRef"]
    inner = "self.args.exists(a, a.size() > 0) && self.env.all(e, has(e.nme))"
    assert list(undeclared_fields(ENV.compile(inner), {"self": engine})) == ["nme"]


@pytest.mark.parametrize(("path", "node", "rule"), RULES, ids=RULE_IDS)
def test_field_path_names_a_declared_field(path: str, node: Schema, rule: dict[str, str]) -> None:
    if "fieldPath" not in rule:
        return
    assert re.fullmatch(r"(\.[A-Za-z_][A-Za-z0-9_]*)+", rule["fieldPath"]), rule["fieldPath"]
    here = node
    for name in rule["fieldPath"].split(".")[1:]:
        assert name in here.get("properties", {}), f"{path}: fieldPath {rule['fieldPath']} is not declared"
        here = here["properties"][name]


# ------------------------------------------------------------------ the API server's verdict


def _re2_pattern(validator: Any, pattern: str, instance: Any, schema: Schema) -> Iterator[Any]:
    # The API server's OpenAPI patterns are Go regexps (RE2): '$' is the end of the text, where
    # Python's re also matches before a final newline.
    if validator.is_type(instance, "string") and not re2.search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


OpenAPIValidator = jsonschema.validators.extend(jsonschema.Draft4Validator, {"pattern": _re2_pattern})


def rules_at(schema: Schema, value: Any, path: str = "") -> Iterator[tuple[str, Schema, dict[str, str], Any]]:
    """(path, schema node, rule, value) for every rule whose node is present in ``value``."""
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, schema, rule, value
    if isinstance(value, dict):
        extra = schema.get("additionalProperties")
        for name, item in value.items():
            sub = schema.get("properties", {}).get(name, extra if isinstance(extra, dict) else None)
            if sub is not None:
                yield from rules_at(sub, item, f"{path}.{name}" if path else name)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from rules_at(schema["items"], item, f"{path}[{i}]")


def api_server_refusals(obj: dict[str, Any]) -> list[tuple[str, dict[str, str], Any]] | list[str]:
    """What the API server refuses ``obj`` for: schema errors (strings), else the failing CEL rules
    as (path, rule, self). A rule that does not evaluate to a bool fails the test: the API server
    would refuse with an evaluation error, a rule bug either way."""
    defaulted = apply_defaults(SCHEMA, obj)
    schema_errors = [e.message for e in OpenAPIValidator(SCHEMA).iter_errors(defaulted)]
    if schema_errors:
        return schema_errors  # CEL runs only on objects that pass the schema
    failed = []
    for path, node, rule, value in rules_at(SCHEMA, defaulted):
        verdict = program(rule["rule"]).evaluate({"self": to_cel(node, value)})
        assert isinstance(verdict, celtypes.BoolType), f"{path}: {rule['rule']} gave {verdict!r}"
        if not verdict:
            failed.append((path, rule, to_cel(node, value)))
    return failed


def model_refusal(spec: dict[str, Any]) -> str | None:
    try:
        models.validate_spec(copy.deepcopy(spec))
    except models.InvalidFleetSpec as err:
        return str(err)
    return None


def fleet(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": "f", "namespace": "default"},
        "spec": spec,
    }


REFUSED = models.refused_engine_flags()


def expected_named_index(rule: dict[str, str], args: list[str]) -> int:
    """The first item of ``args`` the rule refuses, by the models' own table of refused spellings."""
    flags = {flag for written, flag in REFUSED.items() if f"'{written}'" in rule["rule"]}
    return next(i for i, arg in enumerate(args) if REFUSED.get(arg.split("=", 1)[0]) in flags)


def assert_same_verdict(spec: dict[str, Any]) -> None:
    refusals = api_server_refusals(fleet(spec))
    refused_by_model = model_refusal(spec)
    assert bool(refusals) == bool(refused_by_model), (
        f"API server {'refuses' if refusals else 'accepts'}"
        f"{': ' + repr(refusals) if refusals else ''}; models "
        f"{'refuse: ' + refused_by_model if refused_by_model else 'accept'}; spec={spec!r}"
    )
    named_by_rules = []
    for refusal in refusals:
        if isinstance(refusal, str) or "messageExpression" not in refusal[1]:
            continue
        path, rule, self_value = refusal
        said = program(rule["messageExpression"]).evaluate({"self": self_value})
        # the API server says it only if it is a non-empty single-line string (else the message)
        assert isinstance(said, str) and said.strip() and "\n" not in said, said
        assert said.startswith(f"{path}."), f"{said!r} names no field under {path}"
        if said.startswith("spec.engine.args["):
            index = expected_named_index(rule, spec["engine"]["args"])
            assert said.startswith(f"spec.engine.args[{index}] "), said
            named_by_rules.append(index)
    # the models stop at the first listen or config arg they refuse: a rule names that one too
    first = re.search(
        r"spec\.engine\.args\[(\d+)\]: '[^']*'"
        r"( \(argparse reads it as --\w+\))?( would move|: a config file)",
        refused_by_model or "",
    )
    # (only where the rules ran: the API server runs none on an object its schema refuses)
    # ...by its static message (no index: see models._no_engine_arg), unless a messageExpression named it
    if first and not any(isinstance(refusal, str) for refusal in refusals):
        assert int(first.group(1)) in named_by_rules or any(
            refusal[1]["message"].startswith("spec.engine.args must not") for refusal in refusals
        ), (refused_by_model, refusals)


# ------------------------------------------------------------------ specs around the boundaries

LISTEN_AND_CONFIG_SPELLINGS = sorted(REFUSED)
REFUSED_ARGS = [
    *LISTEN_AND_CONFIG_SPELLINGS,
    *(f"{s}=x" for s in LISTEN_AND_CONFIG_SPELLINGS),
    *(f"{s}=" for s in ("--port", "--co")),
]
HARMLESS_ARGS = [
    # look-alikes the models and the rules both accept: shorter than ENGINE_FLAG_PREFIX_MIN, longer
    # options starting like a refused one, another case, a single dash
    "--p", "--h", "--c", "--u", "--port-range", "--portx=1", "--hostname", "--context-length",
    "--config-format", "--uds-path", "--PORT", "--port\n", "-port", "--port ", " --port", "port", "--",
    # values and other flags
    "--tp", "2", "9000", "::", "true", "", "-1", "-",
]  # fmt: skip
# SGLang's metrics flag, bare, valued and misspelt
METRICS_ARGS = ["--enable-metrics", "--enable-metrics=true", "--enable-metrics=", "--enable-metricsx"]
harmless_args = st.sampled_from(HARMLESS_ARGS) | st.text(alphabet="-=portchsfigu", max_size=9)
# Mostly look-alikes, with a few refused spellings dropped in: a spec refused for one arg only is
# where a rule that misses a spelling shows.
args_lists = st.builds(
    lambda harmless, risky, at: [*harmless[:at], *risky, *harmless[at:]],
    st.lists(harmless_args, max_size=5),
    st.lists(st.sampled_from(REFUSED_ARGS) | st.sampled_from(METRICS_ARGS), max_size=2),
    st.integers(0, 5),
)
PORTS = [8000, 8100, 30000, 31000]


def _optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


def _rarely(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    # absent 3 times in 4: fewer specs refused for several reasons at once
    return st.one_of(st.none(), st.none(), st.none(), strategy)


def _drop_none(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


engines = st.builds(
    _drop_none,
    kind=st.sampled_from(models.ENGINE_KINDS),
    args=_optional(args_lists),
    port=_optional(st.sampled_from(PORTS)),
    env=_rarely(
        st.lists(
            st.builds(
                _drop_none,
                name=st.sampled_from(["A", "B"]),
                value=_optional(st.sampled_from(["", "v"])),
                valueFrom=_optional(st.just({"secretKeyRef": {"name": "s", "key": "k"}})),
            ),
            max_size=3,
        )
    ),
)
LABEL_KEYS = [
    "team",
    "prefixfleet.io/fleet",
    "prefixfleet.io",
    "xprefixfleet.io/a",
    *models.OPERATOR_LABELS,
    "app.kubernetes.io/part-of",
]
# a trailing newline: a Go regexp's '$' (the API server's patterns and CEL's matches) is the end of
# the text, where Python's re also matches before a final newline
CONTAINER_NAMES = ["engine", "sidecar", "gateway", "log-shipper", "fetch", "fetch\n"]
containers = st.lists(
    st.builds(
        _drop_none,
        name=st.sampled_from(CONTAINER_NAMES),
        image=_optional(st.just("busybox:1.36")),
    ),
    max_size=3,
)
pod_templates = st.builds(
    _drop_none,
    metadata=_optional(
        st.builds(
            _drop_none,
            labels=_optional(st.dictionaries(st.sampled_from(LABEL_KEYS), st.just("x"), max_size=3)),
            annotations=_optional(st.dictionaries(st.sampled_from(LABEL_KEYS), st.just("x"), max_size=3)),
        )
    ),
    spec=_optional(
        st.builds(
            _drop_none,
            containers=_optional(containers),
            initContainers=_optional(containers),
            volumes=_optional(
                st.lists(
                    st.builds(
                        _drop_none,
                        name=_optional(st.sampled_from(["cache", "ca", "cache\n", "settings"])),
                        emptyDir=st.just({}),
                    ),
                    max_size=3,
                )
            ),
        )
    ),
)
# host and port as the sidecar reads them (router/addresses.py authority_error), each side of the rule
REDIS_URLS = [
    "redis://r:6379/0",
    "redis://[::1]:6379/0",
    "redis://::1:6379/0",
    "rediss://u:p@[fd00::12]:6380",
    "redis://u:p@fd00::12:6380/1",
    "redis://r:0/0",
    "redis://r:65536",
    "unix:///run/redis.sock",
    "redis://[r]:6379",
    "redis://[::1]6379",
    "redis://r:6379\n",
]
PROMETHEUS_URLS = [
    "http://prometheus:9090", "http://[fd00::9]:9090/prom", "http://fd00::9:9090", "https://a:b@[::1]",
    "http://p:99999", "http://[fe80::1%25eth0]:9090",
]  # fmt: skip
MATCH_LABEL_KEYS = ["namespace", "fleet", "_x", "a1", "1a", "a-b", "a.b", "", "fleet\n"]
# targetLoad is in [0.01, 1], scaleDownLoad in (0, 1) (schema ranges); integers test the number typing
LOADS = [0.005, 0.01, 0.5, 0.6, 0.7, 1, 1.0]
autoscalings = st.builds(
    _drop_none,
    enabled=_optional(st.booleans()),
    minReplicas=_optional(st.integers(0, 5)),
    maxReplicas=_optional(st.integers(1, 5)),
    targetLoad=_optional(st.sampled_from(LOADS)),
    scaleDownLoad=_optional(st.sampled_from([x for x in LOADS if x < 1])),
)
specs = st.builds(
    _drop_none,
    model=st.just({"name": "m"}),
    engine=engines | st.builds(lambda e, t: {**e, "podTemplate": t}, engines, pod_templates),
    replicas=_optional(st.integers(0, 6)),
    autoscaling=_rarely(autoscalings),
    router=_rarely(st.builds(lambda t: {"podTemplate": t}, pod_templates)),
    sidecar=_rarely(st.builds(_drop_none, port=_optional(st.sampled_from(PORTS)))),
    redis=_rarely(
        st.builds(
            _drop_none,
            url=_optional(st.sampled_from(REDIS_URLS)),
            secretRef=_optional(st.just({"name": "s", "key": "url"})),
        )
    ),
    prometheus=_rarely(
        st.builds(
            _drop_none,
            url=_optional(st.sampled_from(PROMETHEUS_URLS)),
            matchLabels=_optional(
                st.dictionaries(st.sampled_from(MATCH_LABEL_KEYS), st.just("x"), max_size=3)
            ),
        )
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs)
def test_the_api_server_and_the_models_agree(spec: dict[str, Any]) -> None:
    assert_same_verdict(spec)


# Boundaries checked on every run, whatever hypothesis draws (each side of each rule).
BOUNDARIES: dict[str, dict[str, Any]] = {
    "replicas at the autoscaling bounds": {
        "replicas": 4,
        "autoscaling": {"enabled": True, "minReplicas": 4, "maxReplicas": 4},
    },
    "replicas above them": {"replicas": 5, "autoscaling": {"enabled": True, "maxReplicas": 4}},
    "replicas above them, autoscaling off": {"replicas": 5, "autoscaling": {"maxReplicas": 4}},
    "min equal to max": {"autoscaling": {"minReplicas": 3, "maxReplicas": 3}},
    "the most replicas": {
        "replicas": models.MAX_REPLICAS,
        "autoscaling": {"maxReplicas": models.MAX_REPLICAS},
    },
    "one replica more": {"replicas": models.MAX_REPLICAS + 1},
    "min above max": {"autoscaling": {"minReplicas": 4, "maxReplicas": 3}},
    "scaleDownLoad equal to targetLoad": {"autoscaling": {"targetLoad": 0.6, "scaleDownLoad": 0.6}},
    "targetLoad written as an integer": {"autoscaling": {"targetLoad": 1, "scaleDownLoad": 0.9}},
    "the sidecar on vLLM's default port": {"engine": {"kind": "vllm"}, "sidecar": {"port": 8000}},
    "the sidecar on SGLang's default port, engine moved": {
        "engine": {"kind": "sglang", "port": 31000},
        "sidecar": {"port": 30000},
    },
    "the engine on the default sidecar port": {"engine": {"kind": "emulator", "port": 8100}},
    "the shortest refused abbreviation": {"engine": {"kind": "vllm", "args": ["--tp", "2", "--po"]}},
    "a shorter one": {"engine": {"kind": "vllm", "args": ["--p", "1"]}},
    "config, then port": {"engine": {"kind": "sglang", "args": ["--conf=c", "--port", "1"]}},
    "SGLang's bare metrics flag last": {"engine": {"kind": "sglang", "args": ["--tp", "--enable-metrics"]}},
    "SGLang's metrics flag with a value": {"engine": {"kind": "sglang", "args": ["--enable-metrics", "1"]}},
    "SGLang's metrics flag twice, the second with a value": {
        "engine": {"kind": "sglang", "args": ["--enable-metrics", "--tp", "--enable-metrics", "true"]}
    },
    "SGLang's metrics flag twice, bare": {
        "engine": {"kind": "sglang", "args": ["--enable-metrics", "--enable-metrics"]}
    },
    "vLLM's metrics flag with a value": {"engine": {"kind": "vllm", "args": ["--enable-metrics", "1"]}},
    "an env var with both sources": {
        "engine": {"kind": "vllm", "env": [{"name": "A", "value": "", "valueFrom": {}}]}
    },
    "Redis url and secretRef": {"redis": {"url": "redis://r", "secretRef": {"name": "s", "key": "k"}}},
    "the operator's label": {
        "engine": {"kind": "vllm", "podTemplate": {"metadata": {"labels": {"prefixfleet.io/x": "y"}}}}
    },
    "a label like the operator's prefix": {
        "engine": {"kind": "vllm", "podTemplate": {"metadata": {"labels": {"prefixfleet.io": "y"}}}}
    },
    "two engine containers": {
        "engine": {"kind": "vllm", "podTemplate": {"spec": {"containers": [{"name": "engine"}] * 2}}}
    },
    "an added container without an image": {
        "engine": {"kind": "vllm", "podTemplate": {"spec": {"containers": [{"name": "x"}]}}}
    },
    "the gateway container, no image, in the router's template": {
        "router": {"podTemplate": {"spec": {"containers": [{"name": "gateway"}]}}}
    },
    "the engine container, no image, in the router's template": {
        "router": {"podTemplate": {"spec": {"containers": [{"name": "engine"}]}}}
    },
    "the operator's annotation in the router's template": {
        "router": {"podTemplate": {"metadata": {"annotations": {"prefixfleet.io/spec-hash": "y"}}}}
    },
    "two volumes of one name": {
        "router": {"podTemplate": {"spec": {"volumes": [{"name": "ca", "emptyDir": {}}] * 2}}}
    },
    "the gateway's settings volume in the router's template": {
        "router": {"podTemplate": {"spec": {"volumes": [{"name": "settings", "configMap": {"name": "x"}}]}}}
    },
    "a volume named settings in the engine's template (replica pods have none of theirs)": {
        "engine": {
            "kind": "vllm",
            "podTemplate": {"spec": {"volumes": [{"name": "settings", "emptyDir": {}}]}},
        }
    },
    "a match label that is no label name": {"prometheus": {"matchLabels": {"1a": "x"}}},
    "a match label name with a dot": {"prometheus": {"matchLabels": {"a.b": "x"}}},
    "a match label name ending in a newline": {"prometheus": {"matchLabels": {"fleet\n": "x"}}},
    "an unbracketed IPv6 Redis host": {"redis": {"url": "redis://fd00::12:6379/0"}},
    "a bracketed IPv6 Redis host": {"redis": {"url": "redis://[fd00::12]:6379/0"}},
    "a Redis port out of range": {"redis": {"url": "redis://r:65536/0"}},
    "a Redis port with a final newline": {"redis": {"url": "redis://r:6379\n"}},
    "a Redis URL on a Unix socket": {"redis": {"url": "unix:///run/redis.sock?db=1"}},
    "an unbracketed IPv6 Prometheus host": {"prometheus": {"url": "http://fd00::9:9090"}},
    "a bracketed IPv6 Prometheus host with a zone": {"prometheus": {"url": "http://[fe80::9%eth0]:9090"}},
    "an added container named with a final newline": {
        "engine": {
            "kind": "vllm",
            "podTemplate": {"spec": {"initContainers": [{"name": "fetch\n", "image": "busybox"}]}},
        }
    },
}


@pytest.mark.parametrize("extra", BOUNDARIES.values(), ids=BOUNDARIES.keys())
def test_the_api_server_and_the_models_agree_at_the_boundaries(extra: dict[str, Any]) -> None:
    assert_same_verdict({"model": {"name": "m"}, "engine": {"kind": "emulator"}, **extra})


# ------------------------------------------------------------------ the URL rule against the router's

URL_SCHEMES = ["redis://", "rediss://", "unix://", "http://", "https://"]
hextets = st.text(alphabet="0123456789abcdefABCDEFg", min_size=0, max_size=5)
ipv6_hosts = st.one_of(
    st.ip_addresses(v=6).map(str),
    st.ip_addresses(v=6).map(lambda a: a.exploded),
    st.ip_addresses(v=6).map(lambda a: str(a).upper()),
    st.ip_addresses(v=4).map(lambda a: f"::ffff:{a}"),
    st.lists(hextets, min_size=1, max_size=10).map(":".join),  # mostly not addresses
    st.sampled_from(["::", "::1", "1::", "1:2:3:4:5:6:7::", "1::2:3:4:5:6:7:8", "::1.2.3.04", "::256.1.1.1",
                     "1:2:3:4:5:6:1.2.3.4", "::1.2.3", ":::", "1:::2", "::1%eth0", "fe80::1%", "::١"]),
)  # fmt: skip
hosts = st.one_of(
    ipv6_hosts.map(lambda h: f"[{h}]"),
    ipv6_hosts,
    st.sampled_from(["", "r", "redis.ns.svc", "10.0.0.1", "[", "a[b", "[::1", "]", "%"]),
)
ports = st.one_of(
    st.integers(0, 70000).map(str),
    st.sampled_from(["", "00080", "0", "65535", "65536", "٣", "²", "6_379", "+1", " 1", "1 ", "x", ":1"]),
)
url_ends = st.sampled_from(["", "/", "/0", "?db=0", "#f", "\n", "/\n", ":1/x", "]", "@h:1"])
urls = st.builds(
    lambda scheme, user, host, port, end: f"{scheme}{user}{host}{port}{end}",
    st.sampled_from(URL_SCHEMES),
    st.sampled_from(["", "u:p@", "u@", ":p@", "a@b@", "u:[::1]@"]),
    hosts,
    st.none().map(lambda _: "") | ports.map(lambda p: f":{p}"),
    url_ends,
)
url_noise = st.builds(
    lambda scheme, rest: scheme + rest,
    st.sampled_from(URL_SCHEMES),
    st.text(alphabet="0123456789af:[]%.@/?#_\n٣", max_size=24),
)


def rule_of(path: str) -> dict[str, str]:
    return next(rule for p, _, rule in RULES if p == f".{path}" and rule.get("fieldPath") == ".url")


@settings(max_examples=1500, deadline=None)
@given(urls | url_noise)
def test_the_url_rule_is_the_routers_authority_rule(url: str) -> None:
    # the pattern (RE2, as the API server runs it) refuses exactly what authority_error refuses
    assert (re2.search(models.URL_AUTHORITY_PATTERN, url) is not None) == (authority_error(url) is None), (
        url,
        authority_error(url),
    )


@pytest.mark.parametrize(
    ("field", "url"),
    [("redis", "redis://::1:6379/0"), ("redis", "redis://h:65536/0"), ("prometheus", "http://fd00::9:9090")],
)
def test_an_unreadable_url_is_refused_at_apply_time_naming_the_field(field: str, url: str) -> None:
    refusals = api_server_refusals(
        fleet({"model": {"name": "m"}, "engine": {"kind": "emulator"}, field: {"url": url}})
    )
    assert [(path, rule["fieldPath"]) for path, rule, _ in refusals] == [(f"spec.{field}", ".url")]
    assert refusals[0][1]["message"].startswith(f"spec.{field}.url: the host and port cannot be read")
    refused = model_refusal({"model": {"name": "m"}, "engine": {"kind": "emulator"}, field: {"url": url}})
    assert refused is not None and refused.startswith(f"spec.{field}.url: ")


def test_the_url_rules_are_in_the_crd() -> None:
    for path in ("spec.redis", "spec.prometheus"):
        assert "matches(" in rule_of(path)["rule"]
