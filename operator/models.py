"""The `PrefixCacheFleet` custom resource as pydantic models: the one source of truth.

The operator validates specs with these models, the CRD YAML (``crds/``, the chart) is generated
from their JSON schema, and every default lives here — nowhere else. Field names are snake_case in
Python and camelCase on the wire (``alias_generator=to_camel``); dump with
``model_dump(by_alias=True, exclude_none=True)``.

Cross-field rules are written twice, side by side in the same class: as a pydantic validator (used
by the operator, the local fleet and the tests) and as a CEL rule (``x-kubernetes-validations``)
that the API server enforces on ``kubectl apply``. Both messages name the offending field.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from prefixfleet.router.addresses import authority_error

GROUP = "prefixfleet.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PrefixCacheFleet"
PLURAL = "prefixcachefleets"
SINGULAR = "prefixcachefleet"
SHORT_NAMES: tuple[str, ...] = ("pcf",)
CRD_NAME = f"{PLURAL}.{GROUP}"

# The project's one image: operator, gateway, sidecar and emulator are subcommands of `prefixfleet`.
# It follows the release; read it at validation time (not import time) wherever it fills a default.
PROJECT_IMAGE = "ghcr.io/prefixfleet/prefixfleet:0.1.0"
# spec.sidecar.image and spec.router.image had this schema default in the CRD up to 0.1.0, and the API
# server wrote it into every fleet stored then (an apply never removes a field its manifest lacks).
# Stored, it is read as unset (FleetSpec._project_images), so those fleets take the operator's image
# after an upgrade instead of staying on the old public one. A literal: it must not follow
# PROJECT_IMAGE, whatever the next release's is.
CRD_0_1_0_DEFAULT_IMAGE = "ghcr.io/prefixfleet/prefixfleet:0.1.0"
FORMER_CRD_DEFAULT_IMAGES: frozenset[str] = frozenset({CRD_0_1_0_DEFAULT_IMAGE})
# What the descriptions of spec.sidecar.image and spec.router.image say unset means.
_PROJECT_IMAGE_DEFAULT_DOC = (
    " Default: the operator's image (PREFIXFLEET_IMAGE, which the chart sets to its"
    " image.repository:image.tag), so it follows operator upgrades;"
    f" {CRD_0_1_0_DEFAULT_IMAGE}, the default an older CRD stored into fleets, is read as unset too."
)

EngineKind = Literal["sglang", "vllm", "emulator"]
ENGINE_KINDS: tuple[str, ...] = get_args(EngineKind)

# Names of the router's routing policies (router/policies). A CRD enum must be static, so the list
# is spelled out here; a test checks that every registered policy appears in it.
RoutingPolicyName = Literal[
    "round_robin",
    "least_loaded",
    "affinity",
    "affinity_balanced",
    "sglang_cache_aware",
    "preble_e2",
    "queue_aware",
]
ROUTING_POLICIES: tuple[str, ...] = get_args(RoutingPolicyName)
# The project's own cost policy (estimated TTFT = wait + prefill of the unmatched suffix).
DEFAULT_ROUTING_POLICY: RoutingPolicyName = "queue_aware"

# Same grammar as Kubernetes' resource.Quantity (what controller-gen emits for ResourceList).
_DECIMAL = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY_PATTERN = rf"^(\+|-)?{_DECIMAL}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_DECIMAL}))?$"
Quantity = int | Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN)]

DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$"
# A fleet's name is the value of its children's labels (at most 63 characters) and starts their
# names (the `<name>-router` Service needs a DNS-1035 label): the CRD refuses any other fleet name.
# 47 = 63 - len("-replica-") - 7 index digits: child names are never truncated, so two fleets of a
# namespace never share (and overwrite) a gateway or a replica pod name.
FLEET_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
FLEET_NAME_MAX_LENGTH = 47
# The most replicas a fleet may ask for: pod names keep room for the index (above), and a typo such
# as 100000000 is refused at apply instead of the operator planning that many pods in one round.
MAX_REPLICAS = 100_000
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"

# Engine defaults that depend on the engine kind. Floating tags: pin a digest/tag in production.
_DEFAULT_ENGINE_IMAGES: dict[str, str] = {
    "sglang": "lmsysorg/sglang:latest",
    "vllm": "vllm/vllm-openai:latest",
    "emulator": PROJECT_IMAGE,
}
_DEFAULT_ENGINE_PORTS: dict[str, int] = {"sglang": 30000, "vllm": 8000, "emulator": 30000}

# Engine flags (SGLang, vLLM and the emulator alike) that choose where the engine listens: the operator
# sets them (127.0.0.1 and spec.engine.port), so a second value in spec.engine.args is refused.
ENGINE_LISTEN_FLAGS: dict[str, str] = {
    "--port": "set spec.engine.port instead",
    "--host": "remove it (only the sidecar talks to the engine)",
    "--uds": "remove it (vLLM would listen on a Unix socket only)",
}
# SGLang's and vLLM's --config FILE reads flags from a YAML file, --host and --port included, where
# no check here can see them.
ENGINE_CONFIG_FLAG = "--config"
# The engines parse args with argparse, which takes any unambiguous prefix of an option for the option
# ('--por 9000' sets the port). Without the engines' full option lists at hand (they change with
# every release), every prefix of a refused flag this long or longer is refused: it names that flag,
# or it is ambiguous and the engine refuses it at start-up anyway. Shorter ones ('--p', '--h') are
# ambiguous in SGLang, vLLM and the emulator (--help, --page-size, --prefill-tokens-per-s...): left to
# the engine rather than refused on a guess.
ENGINE_FLAG_PREFIX_MIN = 4
ENGINE_ARG_MAX_LENGTH = 16384


def refused_engine_flags() -> dict[str, str]:
    """Every spelling of a refused engine flag (the flag, and its abbreviations argparse would
    accept, see ENGINE_FLAG_PREFIX_MIN) -> the flag it stands for."""
    out: dict[str, str] = {}
    for flag in (*ENGINE_LISTEN_FLAGS, ENGINE_CONFIG_FLAG):
        for end in range(ENGINE_FLAG_PREFIX_MIN, len(flag) + 1):
            out.setdefault(flag[:end], flag)
    return out


def _no_engine_arg(message: str, *flags: str) -> dict[str, str]:
    """A CEL rule: no item of spec.engine.args spells one of ``flags`` (refused_engine_flags), bare or
    =VALUE. Its message names the field, not the item's index: a messageExpression building
    ``"spec.engine.args[" + string(index) + "]"`` is costed unbounded by the API server's static
    estimate (it cannot size ``string(<int>)``), which refuses the whole CRD
    (kubernetes/kubernetes#124234). The operator's own validation (the models) names the index."""
    spellings = [f for f, flag in refused_engine_flags().items() if flag in flags]
    spelled = " || ".join(f"a == '{f}' || a.startsWith('{f}=')" for f in spellings)
    return cel(f"!has(self.args) || !self.args.exists(a, {spelled})", message, ".args")


def default_images() -> dict[str, str]:
    """Default image per engine kind plus the project's own image (key ``"prefixfleet"``)."""
    return {**_DEFAULT_ENGINE_IMAGES, "prefixfleet": PROJECT_IMAGE}


def default_engine_port(kind: str) -> int:
    return _DEFAULT_ENGINE_PORTS[kind]


def _cel_default_port() -> str:
    """CEL for the engine kind's default port (``self.engine.kind`` is required, so always set)."""
    *kinds, last = _DEFAULT_ENGINE_PORTS
    expr = str(_DEFAULT_ENGINE_PORTS[last])
    for kind in reversed(kinds):
        expr = f"(self.engine.kind == '{kind}' ? {_DEFAULT_ENGINE_PORTS[kind]} : {expr})"
    return expr


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry (CEL rule evaluated by the API server). No
    messageExpression: one naming an item by index needs ``string(<int>)``, which the API server's
    cost estimate cannot size, and it refuses the whole CRD (see _no_engine_arg)."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


class CamelModel(BaseModel):
    """Base: camelCase on the wire, snake_case in Python, unknown fields refused (typos fail loudly)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_wire(self) -> dict[str, Any]:
        """The JSON form Kubernetes stores (camelCase, no nulls)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# The router's rule for the host and port of a URL (router/addresses.py authority_error: an IPv6 host
# in brackets, a port in 1..65535) as one RE2 pattern, for the CEL rules of spec.redis.url and
# spec.prometheus.url: the API server refuses at apply time what the sidecar and the operator would
# refuse at pod start. tests/test_crd_cel.py holds the pattern against authority_error.
_H16 = "[0-9a-fA-F]{1,4}"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"  # no leading zeros, as ipaddress
_LS32 = f"(?:{_H16}:{_H16}|{_OCTET}(?:[.]{_OCTET}){{3}})"
# RFC 3986's IPv6address: n groups before '::' and the fixed tail after it (what ipaddress accepts)
_IPV6 = "(?:" + "|".join(
    [f"(?:{_H16}:){{6}}{_LS32}", f"::(?:{_H16}:){{5}}{_LS32}"]
    + [
        f"(?:(?:{_H16}:){{0,{before}}}{_H16})?::{tail}"
        for before, tail in enumerate(
            [f"(?:{_H16}:){{4}}{_LS32}", f"(?:{_H16}:){{3}}{_LS32}", f"(?:{_H16}:){{2}}{_LS32}",
             f"{_H16}:{_LS32}", _LS32, _H16, ""]
        )
    ]
) + ")"  # fmt: skip
_PORT = "0*(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
# scheme://[userinfo@]host[:port] up to the first / ? # (a unix:// URL has no host to read): a
# bracketed IPv6 address with an optional %zone, or a host with no ':' and not opening a '['
URL_AUTHORITY_PATTERN = (
    r"^(?:unix://|[a-z]+://(?:[^/?#]*@)?"
    rf"(?:\[{_IPV6}(?:%[^\]/?#@]*)?\]|[^\[:/?#@][^:/?#@]*)?(?::(?:{_PORT})?)?(?:[/?#]|$))"
)
URL_MAX_LENGTH = 2048  # bounds the CEL cost the API server estimates for the pattern


def readable_url(url: str | None) -> str | None:
    """A url field's validator: authority_error's problem, refused."""
    problem = None if url is None else authority_error(url)
    if problem:
        raise ValueError(problem)
    return url


def _cel_url_authority(field: str, example: str) -> dict[str, str]:
    """The CEL rule of authority_error for the url field of this object."""
    pattern = URL_AUTHORITY_PATTERN.replace("\\", "\\\\")
    return cel(
        f"!has(self.url) || self.url.matches('{pattern}')",
        f"{field}: the host and port cannot be read: an IPv6 address goes in brackets ({example}),"
        " the port is a number in 1..65535",
        ".url",
    )


# ---------------------------------------------------------------- spec


class ModelSpec(CamelModel):
    """The served model. Every field is part of the cache identity: changing any flushes the fleet."""

    name: str = Field(
        min_length=1,
        description="Model name or path the engine loads, e.g. meta-llama/Llama-3.1-8B-Instruct.",
    )
    revision: str = Field(
        default="main", min_length=1, description="Model revision (git ref/commit); part of the cache key."
    )
    adapter: str | None = Field(
        default=None, description="LoRA adapter name, if requests use one; part of the cache key."
    )
    position_encoding: str | None = Field(
        default=None, description="Position-encoding configuration (e.g. 'rope'); part of the cache key."
    )
    rope_scaling: str | None = Field(
        default=None, description="RoPE scaling configuration as a string (e.g. JSON); part of the cache key."
    )

    def identity(self) -> str:
        """A stable string of everything that makes cached KV reusable; a change invalidates caches."""
        parts = (
            self.name,
            self.revision,
            self.adapter or "",
            self.position_encoding or "",
            self.rope_scaling or "",
        )
        return "\x1f".join(parts)


class EnvVar(CamelModel):
    name: str = Field(pattern=ENV_NAME_PATTERN, description="Environment variable name.")
    value: str | None = Field(default=None, description="Literal value.")
    value_from: dict[str, Any] | None = Field(
        default=None,
        description="A Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef...), passed through.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env {self.name}: set either value or valueFrom, not both")
        return self

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!(has(self.value) && has(self.valueFrom))",
                    "env: set either value or valueFrom, not both",
                )
            ]
        }
    )


class ResourceRequirements(CamelModel):
    """Container requests/limits, e.g. ``{"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": 1}``."""

    requests: dict[str, Quantity] = Field(default_factory=dict, description="Resource requests (quantities).")
    limits: dict[str, Quantity] = Field(default_factory=dict, description="Resource limits (quantities).")


# ---------------------------------------------------------------- podTemplate (engine and router)
# The planner merges podTemplate.metadata and podTemplate.spec into the pods it generates
# (planner._merge_template; containers by name into the operator's own). What would be dropped
# silently (any other top-level key), would make the API server refuse every pod (a container without
# a name or, when added, an image; a label value that is no string), or would detach pods from their
# fleet (the operator's labels and annotations) is refused at admission, by the schema and CEL rules
# below and by pod_template_problems, with the same messages. spec.engine.podTemplate and
# spec.router.podTemplate follow the same rules; only their field path, the containers they merge
# into and the pods they describe differ (PodTemplateTarget).


@dataclass(frozen=True)
class PodTemplateTarget:
    """Which pods a podTemplate field shapes: its field path, the operator's containers it merges
    into, and the pods' name in messages."""

    field: str
    containers: tuple[str, ...]
    pods: str
    # the operator's own volumes in these pods: a template's volume of that name would be merged into
    # one (two volume sources, refused by the API server, or another ConfigMap mounted in its place)
    volumes: tuple[str, ...] = ()


# the gateway pods' volume of the fleet's router ConfigMap (planner.desired_children)
ROUTER_SETTINGS_VOLUME = "settings"
ENGINE_POD_TEMPLATE = PodTemplateTarget("spec.engine.podTemplate", ("engine", "sidecar"), "replica")
ROUTER_POD_TEMPLATE = PodTemplateTarget(
    "spec.router.podTemplate", ("gateway",), "gateway", volumes=(ROUTER_SETTINGS_VOLUME,)
)
# The labels the operator selects its pods by (planner._labels) and its own key prefix.
OPERATOR_LABELS: tuple[str, ...] = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
)
OPERATOR_KEY_PREFIX = f"{GROUP}/"
CONTAINER_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MAX_TEMPLATE_CONTAINERS = 32
_MSG_UNIQUE = "names must be unique (entries are merged by name)"


def _msg_template_keys(t: PodTemplateTarget) -> str:
    return f"{t.field} takes metadata and spec only (Pod spec fields go under {t.field}.spec)"


def _msg_labels(t: PodTemplateTarget) -> str:
    return (
        f"{t.field}.metadata.labels: {OPERATOR_KEY_PREFIX}* and {', '.join(OPERATOR_LABELS)} are the"
        f" operator's (they tie {t.pods} pods to their fleet)"
    )


def _msg_annotations(t: PodTemplateTarget) -> str:
    return f"{t.field}.metadata.annotations: {OPERATOR_KEY_PREFIX}* are the operator's"


def _msg_needs_image(t: PodTemplateTarget) -> str:
    return (
        f"{t.field}.spec.containers: a container other than {' and '.join(t.containers)}"
        " (which it is merged into) is added to the pod and needs an image"
    )


def _msg_init_needs_image(t: PodTemplateTarget) -> str:
    return f"{t.field}.spec.initContainers: every init container needs an image"


# The lists merged by name (planner._merge_template): a container or volume without a name, or two of
# one name, cannot be merged. A volume has no image (an image volume's is an object): only containers'
# is declared.
MERGED_BY_NAME: tuple[str, ...] = ("containers", "initContainers", "volumes")


def _template_named_list_schema(t: PodTemplateTarget, field: str) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "name": {"type": "string", "maxLength": 63, "pattern": CONTAINER_NAME_PATTERN}
    }
    if field != "volumes":
        properties["image"] = {"type": "string", "minLength": 1}
    return {
        "type": "array",
        "maxItems": MAX_TEMPLATE_CONTAINERS,
        "items": {
            "type": "object",
            "additionalProperties": True,
            "required": ["name"],
            "properties": properties,
        },
        "x-kubernetes-validations": [
            cel(
                "self.all(c, self.exists_one(d, d.name == c.name))", f"{t.field}.spec.{field}: {_MSG_UNIQUE}"
            ),
            *(
                [
                    cel(
                        "self.all(v, !(v.name in [" + ", ".join(f"'{n}'" for n in t.volumes) + "]))",
                        _msg_operator_volume(t),
                    )
                ]
                if field == "volumes" and t.volumes
                else []
            ),
        ],
    }


def _msg_operator_volume(t: PodTemplateTarget) -> str:
    return (
        f"{t.field}.spec.volumes: {', '.join(repr(n) for n in t.volumes)} is the operator's own volume in"
        f" every {t.pods} pod: give yours another name"
    )


# Bounded so the API server's cost estimate of the CEL rules iterating them stays small.
MAX_TEMPLATE_METADATA_KEYS = 128
_STRING_MAP = {
    "type": "object",
    "maxProperties": MAX_TEMPLATE_METADATA_KEYS,
    "additionalProperties": {"type": "string"},
}


def pod_template_schema(t: PodTemplateTarget) -> dict[str, Any]:
    """The CRD schema (with its CEL rules) of a podTemplate field: pod_template_problems' rules."""
    return {
        "type": "object",
        "properties": {
            "metadata": {
                "type": "object",
                "description": f"Labels and annotations added to every {t.pods} pod.",
                "properties": {"labels": _STRING_MAP, "annotations": _STRING_MAP},
                "x-kubernetes-validations": [
                    cel(
                        "!has(self.labels) || self.labels.all(k, !k.startsWith('"
                        + OPERATOR_KEY_PREFIX
                        + "') && !(k in ["
                        + ", ".join(f"'{label}'" for label in OPERATOR_LABELS)
                        + "]))",
                        _msg_labels(t),
                        ".labels",
                    ),
                    cel(
                        "!has(self.annotations)"
                        f" || self.annotations.all(k, !k.startsWith('{OPERATOR_KEY_PREFIX}'))",
                        _msg_annotations(t),
                        ".annotations",
                    ),
                ],
            },
            "spec": {
                "type": "object",
                "description": f"Pod spec fields merged into every {t.pods} pod (containers, initContainers"
                " and volumes by name, a container's env, ports and volumeMounts as kubectl patch merges"
                " them; other lists replace the generated ones).",
                "additionalProperties": True,
                "properties": {field: _template_named_list_schema(t, field) for field in MERGED_BY_NAME},
                "x-kubernetes-validations": [
                    cel(
                        "!has(self.containers) || self.containers.all(c, c.name in ["
                        + ", ".join(f"'{n}'" for n in t.containers)
                        + "] || has(c.image))",
                        _msg_needs_image(t),
                        ".containers",
                    ),
                    cel(
                        "!has(self.initContainers) || self.initContainers.all(c, has(c.image))",
                        _msg_init_needs_image(t),
                        ".initContainers",
                    ),
                ],
            },
        },
    }


def pod_template_problems(template: Any, t: PodTemplateTarget) -> list[str]:
    """What is wrong with a podTemplate, one line per problem naming its field (empty: fine)."""
    if not isinstance(template, dict):
        return [f"{t.field}: must be an object with metadata and/or spec"]
    problems = [
        f"{t.field}.{key}: unknown field; {_msg_template_keys(t)}"
        for key in template
        if key not in ("metadata", "spec")
    ]
    meta, spec = template.get("metadata"), template.get("spec")
    if meta is not None:
        problems += _template_metadata_problems(meta, t)
    if spec is not None:
        if not isinstance(spec, dict):
            return [*problems, f"{t.field}.spec: must be an object (Pod spec fields)"]
        for field in MERGED_BY_NAME:
            if spec.get(field) is not None:
                problems += _template_named_list_problems(field, spec[field], t)
    return problems


def _template_metadata_problems(meta: Any, t: PodTemplateTarget) -> list[str]:
    where = f"{t.field}.metadata"
    if not isinstance(meta, dict):
        return [f"{where}: must be an object (labels, annotations)"]
    problems = [
        f"{where}.{key}: unknown field; only labels and annotations are merged into the pods"
        for key in meta
        if key not in ("labels", "annotations")
    ]
    for field in ("labels", "annotations"):
        values = meta.get(field)
        if values is None:
            continue
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            problems.append(f"{where}.{field}: must map names to strings")
            continue
        if len(values) > MAX_TEMPLATE_METADATA_KEYS:
            problems.append(f"{where}.{field}: at most {MAX_TEMPLATE_METADATA_KEYS} entries")
        if field == "labels" and any(
            k.startswith(OPERATOR_KEY_PREFIX) or k in OPERATOR_LABELS for k in values
        ):
            problems.append(_msg_labels(t))
        if field == "annotations" and any(k.startswith(OPERATOR_KEY_PREFIX) for k in values):
            problems.append(_msg_annotations(t))
    return problems


def _template_named_list_problems(field: str, items: Any, t: PodTemplateTarget) -> list[str]:
    where = f"{t.field}.spec.{field}"
    what, example = ("volume", "cache") if field == "volumes" else ("container", t.containers[0])
    if not isinstance(items, list):
        return [f"{where}: must be a list of {what}s (objects with a name)"]
    if len(items) > MAX_TEMPLATE_CONTAINERS:
        return [f"{where}: at most {MAX_TEMPLATE_CONTAINERS} {what}s"]
    problems, names = [], []
    for i, item in enumerate(items):
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or not re.fullmatch(CONTAINER_NAME_PATTERN, name) or len(name) > 63:
            problems.append(f"{where}[{i}].name: every {what} needs a name (a DNS label, e.g. {example})")
            continue
        names.append(name)
        image = item.get("image")
        if (
            field != "volumes"
            and not (isinstance(image, str) and image)
            and (field == "initContainers" or name not in t.containers)
        ):
            problems.append(_msg_needs_image(t) if field == "containers" else _msg_init_needs_image(t))
    if len(set(names)) != len(names):
        problems.append(f"{where}: {_MSG_UNIQUE}")
    if field == "volumes" and set(names) & set(t.volumes):
        problems.append(_msg_operator_volume(t))
    return problems


def _mergeable(t: PodTemplateTarget) -> AfterValidator:
    """The field validator of a podTemplate: pod_template_problems, refused as one message."""

    def check(value: dict[str, Any]) -> dict[str, Any]:
        problems = pod_template_problems(value, t)
        if problems:
            raise ValueError("; ".join(problems))
        return value

    return AfterValidator(check)


EnginePodTemplate = Annotated[
    dict[str, Any], WithJsonSchema(pod_template_schema(ENGINE_POD_TEMPLATE)), _mergeable(ENGINE_POD_TEMPLATE)
]
RouterPodTemplate = Annotated[
    dict[str, Any], WithJsonSchema(pod_template_schema(ROUTER_POD_TEMPLATE)), _mergeable(ROUTER_POD_TEMPLATE)
]


class EngineSpec(CamelModel):
    """The inference engine each replica pod runs (behind the prefixfleet sidecar)."""

    kind: EngineKind = Field(
        description="Engine: sglang | vllm | emulator (GPU-free SGLang-compatible emulator)."
    )
    image: str | None = Field(
        default=None,
        min_length=1,
        description="Engine image. Default per kind: sglang lmsysorg/sglang, vllm vllm/vllm-openai,"
        " emulator the prefixfleet image.",
    )
    # Items are bounded so the API server's cost estimate of the CEL rules over args stays small.
    args: list[Annotated[str, StringConstraints(max_length=ENGINE_ARG_MAX_LENGTH)]] = Field(
        default_factory=list,
        max_length=512,
        description="Extra engine arguments appended to the generated command.",
    )
    port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Engine HTTP port. Default per kind: sglang 30000, vllm 8000, emulator 30000.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Engine container resources; GPUs as nvidia.com/gpu.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=256,
        description="Extra environment variables for the engine container.",
    )
    # The engine's API key from a Secret: the sidecar must send it on its own requests to the engine
    # (probes, pre-warm), else a keyed engine refuses them (docs/gateway.md). Env from secretKeyRef
    # only, never args (a key in args shows in the pod spec); the kubelet reads the Secret, not the
    # operator.
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="The engine's API key, from a Secret: the sidecar gets it as PREFIXFLEET_ENGINE_API_KEY"
        " (for its own requests to the engine), the engine as VLLM_API_KEY (vllm) or --api-key"
        " $(PREFIXFLEET_ENGINE_API_KEY) (sglang); the emulator is given no key (only its sidecar gets"
        " it: the operator does not pass the emulator's own --api-key). Clients then send"
        " Authorization: Bearer <key>.",
    )
    pod_template: EnginePodTemplate | None = Field(
        default=None,
        description="Pod fields merged into every replica pod: metadata (labels, annotations) and spec"
        " (nodeSelector, tolerations, volumes, ...; containers merge by name into engine and sidecar).",
    )
    # The engine listens on loopback only, so no kubelet probe can restart a hung one: the operator
    # replaces the pod instead (operator/planner.py, plan_unhealthy).
    replace_unready_after_seconds: int = Field(
        default=120,
        ge=0,
        le=86400,
        description="A replica pod that was Ready and has been unready this long (a hung engine) is"
        " deleted and recreated, one at a time; 0 = never.",
    )
    replace_never_ready_after_seconds: int = Field(
        default=0,
        ge=0,
        le=86400,
        description="A running replica pod that has never been Ready this long (an engine that never came"
        " up) is deleted and recreated, one at a time; 0 = never (model loads can take many minutes).",
    )

    @model_validator(mode="after")
    def _kind_defaults(self) -> EngineSpec:
        # Kind-dependent defaults cannot be expressed as schema defaults; fill them here, once.
        if self.image is None:
            # The emulator's is PROJECT_IMAGE as it is now, as the sidecar's (FleetSpec._project_images).
            self.image = PROJECT_IMAGE if self.kind == "emulator" else _DEFAULT_ENGINE_IMAGES[self.kind]
        if self.port is None:
            self.port = _DEFAULT_ENGINE_PORTS[self.kind]
        return self

    @model_validator(mode="after")
    def _args_leave_the_listen_address_alone(self) -> EngineSpec:
        # The sidecar reaches the engine at 127.0.0.1:spec.engine.port; an engine listening anywhere
        # else starts fine and never serves a request.
        refused = refused_engine_flags()
        for i, arg in enumerate(self.args):
            written = arg.split("=", 1)[0]
            flag = refused.get(written)
            if flag is None:
                continue
            shown = repr(arg) if written == flag else f"{arg!r} (argparse reads it as {flag})"
            if flag == ENGINE_CONFIG_FLAG:
                raise ValueError(
                    f"spec.engine.args[{i}]: {shown}: a config file can set the engine's --host and"
                    f" --port, which the operator owns (127.0.0.1:{self.port}, where the sidecar reaches"
                    " it); pass the file's other settings as args instead"
                )
            raise ValueError(
                f"spec.engine.args[{i}]: {shown} would move the engine off 127.0.0.1:{self.port},"
                f" where the sidecar reaches it; {ENGINE_LISTEN_FLAGS[flag]}"
            )
        return self

    @model_validator(mode="after")
    def _sglang_metrics_flag_is_bare(self) -> EngineSpec:
        # The operator always passes SGLang's --enable-metrics (planner.engine_command); it is a
        # store_true flag, so a value ('--enable-metrics=true', '--enable-metrics true') stops
        # SGLang's argument parser at start-up, and would sit next to the operator's own flag. The
        # bare flag is accepted once (the CEL rule can check the item after one occurrence only).
        if self.kind != "sglang":
            return self
        for i, arg in enumerate(self.args):
            following = self.args[i + 1] if i + 1 < len(self.args) else "-"
            if arg == "--enable-metrics" and "--enable-metrics" in self.args[:i]:
                raise ValueError(
                    f"spec.engine.args[{i}]: '--enable-metrics' a second time: SGLang's --enable-metrics"
                    " takes no value and the operator always passes it; remove it"
                )
            if arg.startswith("--enable-metrics=") or (
                arg == "--enable-metrics" and not following.startswith("-")
            ):
                shown = arg if arg != "--enable-metrics" else f"--enable-metrics {following}"
                raise ValueError(
                    f"spec.engine.args[{i}]: {shown!r}: SGLang's --enable-metrics takes no value and"
                    " the operator always passes it; remove it"
                )
        return self

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.kind != 'sglang' || !has(self.args)"
                    " || (!self.args.exists(a, a.startsWith('--enable-metrics='))"
                    " && (!self.args.exists(a, a == '--enable-metrics')"
                    " || (self.args.exists_one(a, a == '--enable-metrics')"
                    " && (self.args.indexOf('--enable-metrics') == size(self.args) - 1"
                    " || self.args[self.args.indexOf('--enable-metrics') + 1].startsWith('-')))))",
                    "spec.engine.args: SGLang's --enable-metrics takes no value and the operator"
                    " always passes it; remove it",
                    ".args",
                ),
                _no_engine_arg(
                    "spec.engine.args must not set the engine's --host, --port or --uds (nor an"
                    f" abbreviation of {ENGINE_FLAG_PREFIX_MIN} characters or more, which argparse"
                    " accepts): the sidecar reaches the engine at 127.0.0.1 on spec.engine.port (set the"
                    " port there)",
                    *ENGINE_LISTEN_FLAGS,
                ),
                _no_engine_arg(
                    "spec.engine.args must not pass --config (or an abbreviation): a config file can set"
                    " the engine's --host and --port, which the operator owns; pass its settings as args",
                    ENGINE_CONFIG_FLAG,
                ),
            ]
        }
    )


# The autoscaler divides the projected demand by targetLoad and projects demand leadTimeSeconds
# ahead: a targetLoad of 1e-310 or a lead time of 1e308 made that infinite and the planner raised
# OverflowError every round. 1 % busy and an hour's start-up are beyond any real setting.
MIN_TARGET_LOAD = 0.01
MAX_LEAD_TIME_S = 3600


class AutoscalingSpec(CamelModel):
    """Bounds and targets for the prefix-aware autoscaler (the policy itself lives in the planner)."""

    enabled: bool = Field(
        default=False, description="Let the operator change spec.replicas within [minReplicas, maxReplicas]."
    )
    min_replicas: int = Field(
        default=1, ge=0, le=MAX_REPLICAS, description="Lower bound on replicas when autoscaling."
    )
    max_replicas: int = Field(
        default=4, ge=1, le=MAX_REPLICAS, description="Upper bound on replicas when autoscaling."
    )
    target_ttft_seconds: float = Field(
        default=1.0, gt=0, alias="targetTTFTSeconds", description="Time-to-first-token objective per request."
    )
    target_queue_depth: float = Field(
        default=4.0, gt=0, description="Queued requests per replica considered saturated."
    )
    scale_up_cooldown_seconds: int = Field(
        default=60, ge=0, description="Minimum time between two scale-ups."
    )
    scale_down_stabilization_seconds: int = Field(
        default=300, ge=0, description="The fleet must be quiet this long before a scale-down."
    )
    interval_seconds: float = Field(
        default=10.0, ge=1, le=300, description="How often the autoscaler observes the fleet and plans."
    )
    target_load: float = Field(
        default=0.7,
        ge=MIN_TARGET_LOAD,
        le=1,
        description="Prefill load per replica (busy fraction) the autoscaler sizes the fleet for.",
    )
    scale_down_load: float = Field(
        default=0.6,
        gt=0,
        lt=1,
        description="Remove a replica only if the others would run below this prefill load (< targetLoad).",
    )
    hot_rate_rps: float = Field(
        default=0.5, ge=0, description="Subtrees requested less often than this (req/s) are not hot."
    )
    lead_time_seconds: float = Field(
        default=30.0,
        ge=0,
        le=MAX_LEAD_TIME_S,
        description="Start-up time of a replica: demand is projected this far ahead.",
    )
    max_step_up: int = Field(default=2, ge=1, description="At most this many replicas added per decision.")

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"spec.autoscaling.minReplicas ({self.min_replicas}) must be <= "
                f"spec.autoscaling.maxReplicas ({self.max_replicas})"
            )
        if self.scale_down_load >= self.target_load:
            raise ValueError(
                f"spec.autoscaling.scaleDownLoad ({self.scale_down_load}) must be < "
                f"spec.autoscaling.targetLoad ({self.target_load})"
            )
        return self

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.minReplicas <= self.maxReplicas",
                    "spec.autoscaling.minReplicas must be <= spec.autoscaling.maxReplicas",
                    ".minReplicas",
                ),
                cel(
                    "!has(self.scaleDownLoad) || !has(self.targetLoad)"
                    " || self.scaleDownLoad < self.targetLoad",
                    "spec.autoscaling.scaleDownLoad must be < spec.autoscaling.targetLoad",
                    ".scaleDownLoad",
                ),
            ]
        }
    )


DEFAULT_BLOCK_TOKENS = 16  # router/blockhash.py's: summaries of an engine with no block size
VLLM_DEFAULT_BLOCK_SIZE = 16  # vLLM's CacheConfig.DEFAULT_BLOCK_SIZE
BLOCK_SIZE_FLAGS = ("--block-size", "--block_size")  # vLLM's parser takes '_' for '-' in flag names


def last_flag_value(args: Sequence[str], *spellings: str) -> tuple[int, str] | None:
    """(index, value) of the last ``--flag X`` or ``--flag=X`` in ``args`` for any of ``spellings``,
    as argparse reads a valued flag given more than once (the last one wins); None without one. A
    bare flag with nothing after it is left out (argparse refuses it; the engine will say so)."""
    found = None
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in spellings and eq:
            found = (i, value)
        elif arg in spellings and i + 1 < len(args):
            found = (i, args[i + 1])
    return found


def vllm_block_size(kind: EngineKind, args: Sequence[str]) -> int | None:
    """The KV cache block size of an engine speaking vLLM's API (``kind: vllm``, or the emulator with
    ``--api vllm``: planner.sidecar_engine_api decides) from its ``args``: the last ``--block-size``,
    else vLLM's default; None for an engine speaking SGLang's API (its radix cache has no blocks a
    summary must follow). A value that is no whole number >= 1 is refused naming the arg."""
    from .planner import sidecar_engine_api  # planner imports this module

    if sidecar_engine_api(kind, args) != "vllm":
        return None
    given = last_flag_value(args, *BLOCK_SIZE_FLAGS)
    if given is None:
        return VLLM_DEFAULT_BLOCK_SIZE
    i, value = given
    # written as str(int) does (no sign, no leading zero): the CRD's rule compares the text with
    # string(blockTokens), CEL's cheapest check on an arg of up to ENGINE_ARG_MAX_LENGTH characters
    if not (value.isascii() and value.isdigit() and value == str(int(value)) and int(value) >= 1):
        raise ValueError(
            f"spec.engine.args[{i}]: --block-size {value!r} is not a whole number of tokens >= 1"
            " (in decimal, no leading zero)"
        )
    return int(value)


# A fleet created before blockTokens took the engine's block size holds the old CRD default, 16,
# written by the API server though its manifest leaves blockTokens out (and an apply never removes
# a field its last manifest lacked): "leave it out" alone does not help that user.
STORED_BLOCK_TOKENS_HINT = (
    f" (a fleet created under an older CRD holds blockTokens: {DEFAULT_BLOCK_TOKENS}, its default then,"
    " even if the manifest leaves it out: remove it with kubectl patch prefixcachefleet NAME --type=json"
    ' -p \'[{"op": "remove", "path": "/spec/router/blockTokens"}]\')'
)


def _cel_block_size_rule() -> str:
    """CEL of FleetSpec._block_tokens_are_the_engines's refusal, for the forms it can read without
    loops: the API speaks vLLM (kind vllm, or the emulator with one --api item saying vllm) and
    --block-size is given once (any spelling) or not at all. Other forms (a flag repeated: the last
    one wins) are left to the models, which the operator and `operator validate` run: the rule never
    refuses what the models accept."""
    a = "self.engine.args"
    api = "(x == '--api' || x.startsWith('--api='))"
    emulator_vllm = (
        f"(self.engine.kind == 'emulator' && has(self.engine.args) && {a}.exists_one(x, {api})"
        f" && ({a}.exists(x, x == '--api=vllm') || ({a}.exists(x, x == '--api')"
        f" && {a}.indexOf('--api') + 1 < size({a}) && {a}[{a}.indexOf('--api') + 1] == 'vllm')))"
    )
    valued = "(x.startsWith('--block-size=') || x.startsWith('--block_size='))"
    bare = "(x == '--block-size' || x == '--block_size')"
    at = f"({a}.indexOf('--block-size') >= 0 ? {a}.indexOf('--block-size') : {a}.indexOf('--block_size'))"
    bt, default = "self.router.blockTokens", f"self.router.blockTokens == {VLLM_DEFAULT_BLOCK_SIZE}"
    # a bare flag last has no value: argparse refuses it, the models read the default. The valued
    # form compares numbers, not '--block-size=' + string(blockTokens): the API server's cost
    # estimate gives string(int) no size bound, so a concatenation with it is costed unbounded and
    # the whole CRD refused (kubernetes/kubernetes#124234); an arg == string(int) costs the arg's
    # maxLength. A value int() cannot read is one the models refuse too.
    value = f"x.substring({len('--block-size=')})"  # both spellings are as long
    given = (
        f"({a}.exists(x, {valued}) ? {a}.exists(x, {valued} && int({value}) == {bt})"
        f" : ({at} + 1 < size({a}) ? {a}[{at} + 1] == string({bt}) : {default}))"
    )
    size = (
        f"(!has(self.engine.args) || !{a}.exists(x, {valued} || {bare}) ? {default}"
        f" : !{a}.exists_one(x, {valued} || {bare}) || {given})"
    )
    return (
        "!has(self.router) || !has(self.router.blockTokens)"
        f" || !(self.engine.kind == 'vllm' || {emulator_vllm}) || {size}"
    )


class RouterSpec(CamelModel):
    """The fleet's gateway (a Deployment + Service: the fleet's endpoint)."""

    replicas: int = Field(default=1, ge=0, description="Gateway replicas.")
    policy: RoutingPolicyName = Field(default=DEFAULT_ROUTING_POLICY, description="Routing policy.")
    policy_params: dict[str, float] = Field(
        default_factory=dict,
        description="Numeric parameters of the policy by snake_case name, e.g. {cache_threshold: 0.3}.",
    )
    # No schema default: the API server would store it in every fleet, where it stays after the
    # operator's image changes. Unset is filled in by FleetSpec._project_images; a str from then on.
    image: str | None = Field(
        default=None, min_length=1, description="Gateway image." + _PROJECT_IMAGE_DEFAULT_DOC
    )
    port: int = Field(default=8080, ge=1, le=65535, description="Gateway HTTP port (also the Service port).")
    # No schema default: unset is the engine's block size, which depends on spec.engine (filled in
    # by FleetSpec._block_tokens_are_the_engines, as the engine kind's image and port are).
    block_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Tokens per hashed prefix block in replica summaries. Default: the engine's block"
        " size: for vLLM (and the emulator with --api vllm) its --block-size in spec.engine.args, 16"
        f" if not given; {DEFAULT_BLOCK_TOKENS} for SGLang. In front of vLLM it must equal --block-size:"
        " vLLM caches whole blocks of it.",
    )
    resources: ResourceRequirements = Field(
        default_factory=lambda: ResourceRequirements(requests={"cpu": "100m", "memory": "128Mi"}),
        description="Gateway container resources.",
    )
    pod_template: RouterPodTemplate | None = Field(
        default=None,
        description="Pod fields merged into every gateway pod: metadata (labels, annotations) and spec"
        " (imagePullSecrets, serviceAccountName, nodeSelector, tolerations, affinity, ...; containers merge"
        " by name into gateway).",
    )

    @model_validator(mode="after")
    def _known_policy_params(self) -> RouterSpec:
        # Parameters are the policy's constructor keywords; refuse typos here rather than at the gateway.
        from prefixfleet.router.policies import POLICIES, make_policy

        policy_cls = POLICIES.get(self.policy)
        if policy_cls is None or not self.policy_params:
            return self
        known = [p for p in inspect.signature(policy_cls.__init__).parameters if p not in ("self", "cost")]
        for name in self.policy_params:
            if name not in known:
                raise ValueError(
                    f"spec.router.policyParams.{name}: unknown parameter of policy {self.policy!r}; "
                    f"known: {', '.join(known) or 'none'}"
                )
        try:
            make_policy(self.policy, None, **self.policy_params)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"spec.router.policyParams: {exc}") from None
        return self


class SidecarSpec(CamelModel):
    """The prefixfleet sidecar in every replica pod (reverse proxy + prefix summary publisher)."""

    # No schema default, as RouterSpec.image (filled in by FleetSpec._project_images).
    image: str | None = Field(
        default=None, min_length=1, description="Sidecar image." + _PROJECT_IMAGE_DEFAULT_DOC
    )
    port: int = Field(default=8100, ge=1, le=65535, description="Sidecar HTTP port (what the gateway calls).")
    resources: ResourceRequirements = Field(
        default_factory=lambda: ResourceRequirements(requests={"cpu": "50m", "memory": "64Mi"}),
        description="Sidecar container resources.",
    )


class SecretKeyRef(CamelModel):
    name: str = Field(pattern=DNS_SUBDOMAIN_PATTERN, description="Secret name.")
    key: str = Field(pattern=SECRET_KEY_PATTERN, description="Key inside the Secret.")


class RedisSpec(CamelModel):
    """Where summaries, membership and hot subtrees live.

    Neither ``url`` nor ``secretRef``: the operator's own default Redis (set by the chart).
    """

    url: str | None = Field(
        default=None,
        pattern=r"^(redis|rediss|unix)://",
        max_length=URL_MAX_LENGTH,
        description="Redis URL, e.g. redis://prefixfleet-redis:6379/0 (an IPv6 host in brackets:"
        " redis://[fd00::12]:6379/0). No password here (user:pw@ or ?password=): this URL is readable by"
        " anyone who may get PrefixCacheFleets, and the operator copies it as written into the replica"
        " pods' and gateway Deployment's env (Warning Event RedisPasswordInSpec). Put the password in a"
        " Secret named by spec.redis.passwordSecretRef (the URL without it), or the whole URL in a"
        " Secret named by spec.redis.secretRef.",
    )
    secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the full Redis URL (may include the password)."
    )
    password_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the Redis password."
    )
    tls: bool = Field(default=False, description="Connect with TLS (rediss://).")

    _readable_url = field_validator("url")(readable_url)

    @model_validator(mode="after")
    def _one_url(self) -> RedisSpec:
        if self.url is not None and self.secret_ref is not None:
            raise ValueError("spec.redis: set either url or secretRef, not both")
        return self

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!(has(self.url) && has(self.secretRef))",
                    "spec.redis: set either url or secretRef, not both",
                ),
                _cel_url_authority("spec.redis.url", "redis://[fd00::12]:6379/0"),
            ]
        }
    )


# A Prometheus label name (PromQL grammar); values are quoted by the query builder.
PROMETHEUS_LABEL_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
PROMETHEUS_URL_PATTERN = r"^https?://[^/\s?#]+(/[^\s?#]*)?$"


class PrometheusSpec(CamelModel):
    """Where the autoscaler reads engine rates; without a URL (here or the operator's default) it
    scrapes each sidecar's /metrics itself, and it falls back to that whenever Prometheus fails."""

    url: str | None = Field(
        default=None,
        pattern=PROMETHEUS_URL_PATTERN,
        max_length=URL_MAX_LENGTH,
        description="Prometheus base URL (http(s)://host[:port][/path], an IPv6 host in brackets) the"
        " autoscaler queries for engine rates; absent: the operator's default, else each sidecar's"
        " /metrics.",
    )
    rate_window_seconds: int = Field(
        default=60,
        ge=2,
        le=3600,
        description="rate() window of the queries; at least 4 scrape intervals of the replicas.",
    )
    match_labels: dict[str, str] | None = Field(
        default=None,
        max_length=16,
        description="Label matchers (name: exact value) selecting this fleet's engine series; default"
        " {namespace: <fleet namespace>, fleet: <fleet name>}, the labels the chart's PodMonitor gives.",
    )
    pod_label: str = Field(
        default="pod",
        pattern=PROMETHEUS_LABEL_PATTERN,
        description="Label naming the replica pod in those series.",
    )

    _readable_url = field_validator("url")(readable_url)

    @model_validator(mode="after")
    def _label_names(self) -> PrometheusSpec:
        for name in self.match_labels or {}:
            # fullmatch: the API server's '$' (RE2) is the end of the text; re.match's also matches
            # before a final newline, which would accept 'fleet\n'
            if not re.fullmatch(PROMETHEUS_LABEL_PATTERN, name):
                raise ValueError(
                    f"spec.prometheus.matchLabels: {name!r} is not a Prometheus label name"
                    " ([a-zA-Z_][a-zA-Z0-9_]*)"
                )
        return self

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.matchLabels)"
                    " || self.matchLabels.all(k, k.matches('^[a-zA-Z_][a-zA-Z0-9_]*$'))",
                    "spec.prometheus.matchLabels: every key must be a Prometheus label name",
                    ".matchLabels",
                ),
                _cel_url_authority("spec.prometheus.url", "http://[fd00::9]:9090"),
            ]
        }
    )


class PrewarmSpec(CamelModel):
    """Pre-warming new replicas with hot prefix subtrees before they take that traffic."""

    enabled: bool = Field(
        default=True, description="Warm new replicas with hot subtrees before routing them traffic."
    )
    top_subtrees: int = Field(
        default=8, ge=0, description="How many of the hottest subtrees to warm per replica."
    )
    max_warmup_requests: int = Field(
        default=32, ge=0, description="Upper bound on prefill-only warm-up requests per replica."
    )


class AdmissionSpec(CamelModel):
    min_prefix_tokens: int = Field(
        default=16, ge=0, description="Ignore prefix matches shorter than this many tokens."
    )
    admit_after_seen_count: int = Field(
        default=2, ge=1, description="Cache a prefix only after it was seen this many times."
    )


class CacheIdentitySpec(CamelModel):
    tenant_isolation: bool = Field(
        default=False, description="With isolation on, two tenants never share a prefix node."
    )
    salt: str | None = Field(
        default=None, min_length=1, description="Extra salt mixed into every prefix hash."
    )
    admission: AdmissionSpec = Field(default_factory=AdmissionSpec, description="Prefix admission control.")


class FleetSpec(CamelModel):
    """``spec`` of a PrefixCacheFleet."""

    model: ModelSpec = Field(description="The served model (cache identity).")
    engine: EngineSpec = Field(description="The inference engine of every replica.")
    replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICAS,
        description="Desired engine replicas (the scale subresource's spec.replicas).",
    )
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec, description="Autoscaler bounds and targets."
    )
    router: RouterSpec = Field(
        default_factory=RouterSpec, description="The gateway in front of the replicas."
    )
    sidecar: SidecarSpec = Field(default_factory=SidecarSpec, description="The per-replica sidecar.")
    redis: RedisSpec = Field(default_factory=RedisSpec, description="Shared state store.")
    prometheus: PrometheusSpec = Field(
        default_factory=PrometheusSpec, description="Metrics source for the autoscaler."
    )
    prewarm: PrewarmSpec = Field(default_factory=PrewarmSpec, description="Pre-warming of new replicas.")
    cache_identity: CacheIdentitySpec = Field(
        default_factory=CacheIdentitySpec, description="Cache key and tenancy."
    )

    @model_validator(mode="after")
    def _replicas_within_bounds(self) -> FleetSpec:
        a = self.autoscaling
        if a.enabled and not a.min_replicas <= self.replicas <= a.max_replicas:
            raise ValueError(
                f"spec.replicas ({self.replicas}) must be within "
                f"spec.autoscaling.minReplicas ({a.min_replicas}) "
                f"and spec.autoscaling.maxReplicas ({a.max_replicas}) when autoscaling is enabled"
            )
        return self

    @model_validator(mode="after")
    def _project_images(self) -> FleetSpec:
        # Here, not in RouterSpec/SidecarSpec: FleetSpec's defaults for router and sidecar are
        # RouterSpec() and SidecarSpec(), which become the CRD's object defaults, and an image filled
        # in there would be stored again. PROJECT_IMAGE as it is now, so planner.with_project_image
        # (which swaps a value equal to it) gives these pods the operator's configured image.
        for part in (self.router, self.sidecar):
            if part.image is None or part.image in FORMER_CRD_DEFAULT_IMAGES:
                part.image = PROJECT_IMAGE
        return self

    @model_validator(mode="after")
    def _block_tokens_are_the_engines(self) -> FleetSpec:
        # vLLM caches (and reports hits in) whole blocks of --block-size tokens; summaries hashed in
        # other blocks claim prefixes it does not hold or miss ones it does. The sidecar is given
        # blockTokens (planner), so it is the engine's or the fleet is refused.
        size = vllm_block_size(self.engine.kind, self.engine.args)
        if self.router.block_tokens is None:
            self.router.block_tokens = DEFAULT_BLOCK_TOKENS if size is None else size
        elif size is not None and self.router.block_tokens != size:
            raise ValueError(
                f"spec.router.blockTokens ({self.router.block_tokens}) must equal the engine's block"
                f" size, --block-size in spec.engine.args ({size}; vLLM's default"
                f" {VLLM_DEFAULT_BLOCK_SIZE} if not given): vLLM caches whole blocks of it, and the"
                " replicas' summaries are hashed in blockTokens. Set blockTokens to it, or leave"
                f" blockTokens out to take it{STORED_BLOCK_TOKENS_HINT}"
            )
        return self

    @model_validator(mode="after")
    def _engine_and_sidecar_ports_apart(self) -> FleetSpec:
        # Both containers share the replica pod's network namespace: one of them could not bind.
        if self.engine.port == self.sidecar.port:
            raise ValueError(
                f"spec.sidecar.port ({self.sidecar.port}) must differ from spec.engine.port"
                f" ({self.engine.port}; {self.engine.kind}'s default if unset):"
                " both listen in every replica pod"
            )
        return self

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.autoscaling) || !has(self.autoscaling.enabled) || !self.autoscaling.enabled"
                    " || (self.replicas >= self.autoscaling.minReplicas"
                    " && self.replicas <= self.autoscaling.maxReplicas)",
                    "spec.replicas must be within spec.autoscaling.minReplicas and"
                    " spec.autoscaling.maxReplicas when autoscaling is enabled",
                    ".replicas",
                ),
                cel(
                    _cel_block_size_rule(),
                    "spec.router.blockTokens must equal the engine's block size, --block-size in"
                    f" spec.engine.args (vLLM's default {VLLM_DEFAULT_BLOCK_SIZE} if not given): vLLM"
                    " caches whole blocks of it; set blockTokens to it, or leave blockTokens out to"
                    f" take it{STORED_BLOCK_TOKENS_HINT}",
                    ".router.blockTokens",
                ),
                cel(
                    "!has(self.sidecar) || !has(self.sidecar.port) || self.sidecar.port !="
                    f" (has(self.engine.port) ? self.engine.port : {_cel_default_port()})",
                    "spec.sidecar.port must differ from spec.engine.port (or the engine kind's default"
                    " port): both listen in every replica pod",
                    ".sidecar.port",
                ),
            ]
        }
    )


# ---------------------------------------------------------------- status

# Ready, Progressing and Degraded always; RedisPasswordExposed, RedisAccessDenied and
# RedisCommandsRefused only while they hold (planner.REDIS_PASSWORD_EXPOSED, REDIS_ACCESS_DENIED,
# REDIS_REFUSING). The CRD's enum: an API server refuses a status update naming any other type.
ConditionType = Literal[
    "Ready", "Progressing", "Degraded", "RedisPasswordExposed", "RedisAccessDenied", "RedisCommandsRefused"
]
CONDITION_TYPES: tuple[str, ...] = get_args(ConditionType)


class Condition(CamelModel):
    """A Kubernetes-style condition; ``reason`` is CamelCase, ``message`` is for humans."""

    type: ConditionType
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: datetime
    observed_generation: int | None = Field(default=None, ge=0)


# status.hotPrefixes[].holders names at most this many pods (a shared system prompt is held by every
# replica: a bigger fleet's status names the first ones, autoscale_observe.hot_prefixes_status)
HOT_PREFIX_HOLDERS_MAX = 256


class HotPrefix(CamelModel):
    """A hot prefix subtree, by hash only: never raw prompt text."""

    hash: str = Field(min_length=1, description="Hex hash of the prefix node.")
    tokens: int = Field(ge=0, description="Prefix length in tokens.")
    rate: float = Field(ge=0, description="Decayed request rate (requests/s).")
    holders: list[str] = Field(
        default_factory=list, max_length=HOT_PREFIX_HOLDERS_MAX, description="Replica pods that hold it."
    )


EngineMetricsSourceName = Literal["prometheus", "scrape", "mixed", "none"]


class EngineMetricsSource(CamelModel):
    """Where the autoscaler's last round read the engines' token rates and queues."""

    source: EngineMetricsSourceName = Field(
        description="prometheus, scrape (each sidecar's /metrics), mixed (Prometheus lacked some"
        " replicas), none (no replica answered)."
    )
    reason: str = Field(default="", max_length=1024, description="Why that source, for humans.")


class PlannerMemoryStatus(CamelModel):
    """The autoscaler's memory between rounds (``PlannerMemory``), kept here so that a restarted or
    failed-over operator keeps its cooldowns and quiet period instead of starting afresh."""

    observed_time: datetime | None = Field(
        default=None,
        description="When an operator last wrote this memory (at least every 30 s while it runs the"
        " fleet's rounds): an older memory's quiet period and demand trend are not trusted.",
    )
    last_scale_up_time: datetime | None = Field(
        default=None, description="The last scale-up (scaleUpCooldownSeconds counts from here)."
    )
    last_scale_down_time: datetime | None = Field(default=None, description="The last scale-down.")
    calm_since: datetime | None = Field(
        default=None,
        description="Start of the current quiet period (scaleDownStabilizationSeconds counts from"
        " here); absent while the fleet is busy.",
    )
    demand: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="The fleet's smoothed prefill demand (replica-equivalents) at demandTime.",
    )
    demand_time: datetime | None = Field(default=None, description="When demand was measured.")
    demand_slope: float = Field(
        default=0.0,
        allow_inf_nan=False,
        description="Smoothed trend of demand (replica-equivalents per second).",
    )


# What the autoscaler's last round decided (``autoscale.classify_plan``), and what held it back:
# the answer to "why is my fleet not scaling?" that lastScaleReason (written only on a scale) is not.
ScalingAction = Literal["ScaleUp", "ScaleDown", "Prewarm", "Hold"]
ScalingLimit = Literal[
    "TooManyReplicas",  # saturated at maxReplicas, or above it (draining down to it)
    "TooFewReplicas",  # quiet at minReplicas, or below it (scaling up to it)
    "ScaleDownStabilizing",  # quiet, waiting for scaleDownStabilizationSeconds
    "ScaleUpDeferred",  # saturated, waiting for replicas on their way or the scale-up cooldown
    "TooFewReadyReplicas",  # quiet, but no replica could be removed and leave one serving
    "ColdStart",  # the load asks for more, but the fleet has only just started
]
SCALING_ACTIONS: tuple[str, ...] = get_args(ScalingAction)
SCALING_LIMITS: tuple[str, ...] = get_args(ScalingLimit)


class ScalingDecisionStatus(CamelModel):
    """The autoscaler's current decision. Rewritten at once when the action or the limit changes
    (and on every scale), else along with the planner memory (at least every 30 s): the reason's
    counters ("quiet for 37s") are as of observedTime."""

    action: ScalingAction = Field(
        description="ScaleUp, ScaleDown, Prewarm (hot prefixes copied onto idle replicas) or Hold."
    )
    limited_by: ScalingLimit | None = Field(
        default=None,
        description="What keeps the autoscaler from doing more (absent: nothing): TooManyReplicas"
        " (at maxReplicas), TooFewReplicas (at minReplicas), ScaleDownStabilizing (quiet, waiting"
        " for scaleDownStabilizationSeconds), ScaleUpDeferred (saturated, waiting for replicas on"
        " their way or the cooldown), TooFewReadyReplicas, ColdStart.",
    )
    reason: str = Field(default="", max_length=1024, description="The planner's reason, for humans.")
    since: datetime | None = Field(
        default=None, description="When this action and limit began (a scale: when it was decided)."
    )
    observed_time: datetime | None = Field(default=None, description="When the reason was written.")


class AutoscalerStatus(CamelModel):
    """What the autoscaler keeps in the fleet's status."""

    memory: PlannerMemoryStatus | None = Field(
        default=None, description="The planner's memory, restored by an operator that has none."
    )
    decision: ScalingDecisionStatus | None = Field(
        default=None,
        description="The autoscaler's current decision and what limits it; absent while autoscaling is off.",
    )


class FleetStatus(CamelModel):
    """``status`` of a PrefixCacheFleet.

    Extra keys are kept: kopf stores its handler progress under ``status.kopf``.
    """

    model_config = ConfigDict(extra="allow")

    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation this status describes."
    )
    replicas: int = Field(
        default=0, ge=0, description="Replica pods that exist (the scale subresource's status.replicas)."
    )
    ready_replicas: int = Field(default=0, ge=0, description="Replica pods that are Ready and serving.")
    selector: str | None = Field(
        default=None, description="Label selector of the replica pods (for the scale subresource)."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Ready, Progressing and Degraded, each with a CamelCase reason; RedisPasswordExposed,"
        " RedisAccessDenied and RedisCommandsRefused while they hold.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    router_endpoint: str | None = Field(default=None, description="URL of the fleet's gateway Service.")
    hit_rate: float | None = Field(
        default=None, ge=0, le=1, description="Fleet prefix-cache hit rate (token-weighted)."
    )
    hot_prefixes: list[HotPrefix] = Field(
        default_factory=list,
        max_length=100,
        description="The hottest prefix subtrees (hashed) and their holders.",
    )
    last_scale_time: datetime | None = Field(default=None, description="When the replica count last changed.")
    last_scale_reason: str | None = Field(default=None, description="Why the replica count last changed.")
    engine_metrics: EngineMetricsSource | None = Field(
        default=None, description="Where the autoscaler read engine rates in its last round, and why."
    )
    autoscaler: AutoscalerStatus | None = Field(
        default=None,
        description="The autoscaler's memory (survives an operator restart) and current decision.",
    )

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


class PrefixCacheFleet(CamelModel):
    """A whole object as the API server returns it (metadata kept as a plain dict)."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["prefixfleet.io/v1alpha1"] = API_VERSION
    kind: Literal["PrefixCacheFleet"] = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: FleetSpec
    status: FleetStatus | None = None


class InvalidFleetSpec(ValueError):
    """A spec the models refuse; ``str()`` is one line per problem, each naming its field."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def describe_validation_error(exc: ValidationError, root: str = "spec") -> list[str]:
    """``spec.engine.kind: Input should be 'sglang', ...`` — one line per pydantic error."""
    lines = []
    for err in exc.errors(include_url=False):
        path = ".".join([root, *(str(p) for p in err["loc"] if not _is_union_branch(p))])
        msg = err["msg"].removeprefix("Value error, ")
        # Our cross-field messages already start with the full field path; don't repeat it.
        lines.append(msg if msg.startswith(root + ".") else f"{path}: {msg}")
    return list(dict.fromkeys(lines))


def _is_union_branch(part: object) -> bool:
    # pydantic adds the union member tried ("int", "constrained-str") to the location.
    return part in ("int", "str", "constrained-str", "function-after[_kind_defaults(), EngineSpec]")


def validate_spec(spec: dict[str, Any]) -> FleetSpec:
    """Validate a ``spec`` dict (camelCase, as stored by Kubernetes) or raise :class:`InvalidFleetSpec`."""
    try:
        return FleetSpec.model_validate(spec)
    except ValidationError as exc:
        raise InvalidFleetSpec(describe_validation_error(exc)) from None


__all__ = [
    "API_VERSION",
    "CONDITION_TYPES",
    "CRD_0_1_0_DEFAULT_IMAGE",
    "CRD_NAME",
    "DEFAULT_ROUTING_POLICY",
    "ENGINE_KINDS",
    "FLEET_NAME_MAX_LENGTH",
    "FLEET_NAME_PATTERN",
    "FORMER_CRD_DEFAULT_IMAGES",
    "GROUP",
    "KIND",
    "PLURAL",
    "PROJECT_IMAGE",
    "ROUTING_POLICIES",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "AdmissionSpec",
    "AutoscalerStatus",
    "AutoscalingSpec",
    "CacheIdentitySpec",
    "Condition",
    "EngineMetricsSource",
    "EngineSpec",
    "EnvVar",
    "FleetSpec",
    "FleetStatus",
    "HotPrefix",
    "InvalidFleetSpec",
    "ModelSpec",
    "PlannerMemoryStatus",
    "PrefixCacheFleet",
    "PrewarmSpec",
    "PrometheusSpec",
    "RedisSpec",
    "ResourceRequirements",
    "RouterSpec",
    "SecretKeyRef",
    "SidecarSpec",
    "default_engine_port",
    "default_images",
    "describe_validation_error",
    "validate_spec",
]
