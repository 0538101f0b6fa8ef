"""LoRA adapters in the cache identity where the operator owns membership (sidecars run with
``--no-self-register``).

The operator writes each member record from the fleet's spec: it never asks the engine, so its
records carry no ``served_models``, ``adapters`` or ``engine_api``. Before, a gateway of such a fleet
hashed a request naming an adapter under the base identity while the sidecar's mirror (and summary)
named it under the adapter's: prefix routing was blind to adapter traffic on Kubernetes only. Now the
sidecar writes those facts to its own ``engine:{worker}`` key (a key the operator never writes, so a
record rewritten for ``warming``/``draining`` cannot erase them) and gateways merge them into a
record that states none (``records.with_engine``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request

import httpx
import pytest
from fleet_fixtures import RedisServer, Spawner, free_port, prefixfleet_argv, wait_for_http, wait_until
from test_lora_e2e import matched_tokens

from prefixfleet.operator.handlers import OperatorContext, ReconcileOutcome, publish_membership
from prefixfleet.operator.membership import desired_members
from prefixfleet.operator.models import FleetSpec, validate_spec
from prefixfleet.operator.planner import FleetRef, ObservedPod
from prefixfleet.operator.redis_permissions import fleet_commands
from prefixfleet.router.blockhash import CacheIdentity, request_identity
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.proxying import WORKER_HEADER
from prefixfleet.router.records import (
    EngineRecord,
    MemberRecord,
    decode_engine,
    decode_member,
    encode_record,
    with_engine,
)
from prefixfleet.router.summary import SummaryError
from prefixfleet.router.view import FleetView

BASE = "base-model"
SPEC = validate_spec(
    {
        "replicas": 1,
        "engine": {"kind": "vllm", "args": ["--enable-lora", "--lora-modules", "b=/m/b"]},
        "model": {"name": BASE},
    }
)
ENGINE = EngineRecord(served_models=(BASE, "b"), adapters=("b",), engine_api="vllm")


def pod(name: str = "f-replica-0", state: str = "ready", port: int = 8100) -> ObservedPod:
    return ObservedPod(
        name=name, phase="Running", ready=True, pod_ip="127.0.0.1", state=state, port_map={8100: port}
    )


def operator_record(state: str = "ready") -> str:
    """The member record the operator writes for the fleet's one replica (its real code path)."""
    return encode_record(desired_members(SPEC, [pod(state=state)], 0.0)["f-replica-0"])


def adapter_seed_at_gateway(view: FleetView, model: str) -> int:
    return view.request_key(view.workers["f-replica-0"], model, None)[0]


def test_the_gateway_hashes_an_adapter_request_as_the_sidecars_mirror_records_it() -> None:
    """/tmp/h4_h_repro.py: the operator's record alone gave the base identity's seed."""
    record = decode_member(operator_record())
    assert (record.served_models, record.adapters, record.engine_api) == ((), (), "")
    view = FleetView()
    wid = "f-replica-0"
    view.apply_snapshot({wid: operator_record()}, {wid: None}, 0.0, {wid: encode_record(ENGINE)})
    configured = CacheIdentity(record.model, record.revision, record.adapter)
    mirror = request_identity(configured, ENGINE.adapters, ENGINE.engine_api, "b", None).seed()
    assert mirror != configured.seed()
    assert adapter_seed_at_gateway(view, "b") == mirror
    assert adapter_seed_at_gateway(view, BASE) == configured.seed()
    assert view.workers[wid].served_models == (BASE, "b")


def test_a_record_the_operator_rewrites_keeps_the_sidecars_engine_facts() -> None:
    view = FleetView()
    wid = "f-replica-0"
    engines = {wid: encode_record(ENGINE)}
    view.apply_snapshot({wid: operator_record()}, {wid: None}, 0.0, engines)
    seed = adapter_seed_at_gateway(view, "b")
    for state in ("draining", "warming", "ready"):
        view.apply_snapshot({wid: operator_record(state)}, {wid: None}, 1.0, engines)
        assert view.workers[wid].state == state
        assert adapter_seed_at_gateway(view, "b") == seed


def test_a_self_registering_sidecars_record_is_its_own_word() -> None:
    own = MemberRecord(url="http://127.0.0.1:9", model=BASE, adapters=("c",), engine_api="vllm")
    assert with_engine(own, ENGINE) is own
    bare = MemberRecord(url="http://127.0.0.1:9", model=BASE)
    merged = with_engine(bare, ENGINE)
    assert (merged.served_models, merged.adapters, merged.engine_api) == ((BASE, "b"), ("b",), "vllm")
    assert with_engine(bare, None) is bare


def test_a_refused_engine_record_leaves_the_worker_routed_on_its_member_record() -> None:
    view = FleetView()
    wid = "f-replica-0"
    bad = json.dumps({"adapters": [""], "v": 1})
    result = view.apply_snapshot({wid: operator_record()}, {wid: None}, 0.0, {wid: bad})
    assert result.warnings == [
        f"ignoring engine record of {wid!r} (pf:default:engine:{wid}): engine record: field 'adapters' "
        "holds '', not a name of 1-1024 characters"
    ]
    assert wid in view.workers and view.workers[wid].member.adapters == ()  # type: ignore[union-attr]


def test_the_engine_record_wire_format() -> None:
    raw = encode_record(ENGINE)
    assert raw == '{"served_models":["base-model","b"],"adapters":["b"],"engine_api":"vllm","v":1}'
    assert decode_engine(raw) == ENGINE
    assert decode_engine('{"v":1,"later":true}') == EngineRecord()  # fields it does not know: ignored
    with pytest.raises(SummaryError, match="unsupported record version"):
        decode_engine('{"adapters":["b"],"v":2}')
    with pytest.raises(SummaryError, match="'engine_api'"):
        decode_engine('{"engine_api":7,"v":1}')
    assert FleetKeys("team-a.chat").engine("w1") == "pf:team-a.chat:engine:w1"


def test_the_acl_check_asks_for_the_engine_key() -> None:
    keys = FleetKeys("f")
    argvs = {c.argv for c in fleet_commands(keys, "f-replica-0")}
    engine = keys.engine("f-replica-0")
    assert ("SET", engine, "{}", "PX", "10000") in argvs  # the sidecars
    assert ("MGET", engine) in argvs  # the gateways
    assert ("DEL", keys.load("f-replica-0"), keys.summary("f-replica-0"), engine) in argvs  # leaving


# -- real processes: Valkey, a vLLM emulator with adapters, its --no-self-register sidecar, the
# operator's membership write, a gateway ------------------------------------------------------------

FLEET_REF = FleetRef(name="f", namespace="ns", uid="u1")
PROMPT = "operator adapter test " + " ".join(f"word{j}" for j in range(96))


def publish(spec: FleetSpec, redis_url: str, state: str, port: int) -> None:
    """One reconcile's membership write, as the operator does it."""

    async def once() -> None:
        ctx = OperatorContext(kube=None)  # type: ignore[arg-type]  # membership never calls the API server
        outcome = ReconcileOutcome(
            {}, spec=spec, ref=FLEET_REF, pods=(pod(state=state, port=port),), redis_url=redis_url
        )
        try:
            await publish_membership(ctx, outcome, logging.getLogger("test"))
        finally:
            for client in ctx.redis_clients.values():
                await client.aclose()

    asyncio.run(once())


def worker_in_view(gateway: str) -> dict:
    try:
        with urllib.request.urlopen(f"{gateway}/prefixfleet/view", timeout=10) as resp:
            workers = json.load(resp)["workers"]
    except OSError:
        return {}
    return next((w for w in workers if w["worker_id"] == "f-replica-0"), {})


@pytest.mark.timeout(120)
def test_operator_mode_gateway_routes_adapter_requests_by_the_adapter_identity(
    spawn: Spawner, redis_server: RedisServer
) -> None:
    fleet = FLEET_REF.redis_fleet
    spec = validate_spec(
        {
            "replicas": 1,
            "engine": {"kind": "vllm", "args": ["--enable-lora", "--lora-modules", "A=/l/a", "B=/l/b"]},
            "model": {"name": BASE},
        }
    )
    port = free_port()
    spawn(prefixfleet_argv(
        "emulator", "--port", str(port), "--time-scale", "20", "--api", "vllm", "--model", BASE,
        "--enable-prompt-tokens-details", "--enable-lora", "--lora-modules", "A=/l/a", "B=/l/b",
    ), name="engine")  # fmt: skip
    engine = f"http://127.0.0.1:{port}"
    sidecar_port = free_port()
    # the sidecar as the operator's pods run it (planner: --model, --revision, --no-self-register)
    spawn(prefixfleet_argv(
        "router", "sidecar", "--engine", engine, "--redis", redis_server.url, "--port", str(sidecar_port),
        "--worker-id", "f-replica-0", "--fleet", fleet, "--publish-interval", "0.1",
        "--model", BASE, "--revision", spec.model.revision, "--no-self-register",
    ), name="sidecar")  # fmt: skip
    port = free_port()
    spawn(prefixfleet_argv(
        "router", "gateway", "--redis", redis_server.url, "--port", str(port), "--fleet", fleet,
        "--refresh-interval", "0.1",
    ), name="gateway")  # fmt: skip
    gateway = f"http://127.0.0.1:{port}"
    wait_for_http(f"{engine}/health")
    wait_for_http(f"http://127.0.0.1:{sidecar_port}/prefixfleet/status")
    publish(spec, redis_server.url, "ready", sidecar_port)
    wait_for_http(f"{gateway}/health")  # 503 while no worker is routable
    wait_until(
        lambda: worker_in_view(gateway), 30, "the gateway to see the replica's adapters",
        done=lambda w: w.get("routable") and w["adapters"] == ["A", "B"],
    )  # fmt: skip

    def complete(client: httpx.Client, model: str) -> int:
        body = {"model": model, "prompt": PROMPT, "max_tokens": 1}
        answer = client.post(f"{gateway}/v1/completions", json=body)
        assert (answer.status_code, answer.headers[WORKER_HEADER]) == (200, "f-replica-0"), answer.text
        return answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    with httpx.Client(timeout=30) as client:
        assert complete(client, "A") == 0
        wait_until(lambda: worker_in_view(gateway).get("summary_blocks", 0), 30, "the summary of A's prompt")
        before = matched_tokens(gateway)
        assert complete(client, "A") > 0
        after_a = matched_tokens(gateway)
        assert after_a > before  # predicted, under A's identity (the summary's)
        # the operator rewrites the record (a drain started, then called off): the facts stay
        publish(spec, redis_server.url, "draining", sidecar_port)
        wait_until(lambda: worker_in_view(gateway).get("state"), 30, "draining", done="draining".__eq__)
        publish(spec, redis_server.url, "ready", sidecar_port)
        seen = wait_until(lambda: worker_in_view(gateway), 30, "ready", done=lambda w: w.get("routable"))
        assert seen["adapters"] == ["A", "B"]
        assert complete(client, "B") == 0  # the engine caches per adapter
        assert matched_tokens(gateway) == after_a  # and the gateway predicted no hit (before: A's)
