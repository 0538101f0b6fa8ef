"""Junk in Redis or in an engine's self-description is refused with a named warning, never a crash.

Specification:
* ``prefixfleet router inspect`` reports a fleet whose members hash holds a field that is no worker id
  (e.g. not UTF-8): it names that field on stderr, still reports every real member, and exits 1
  (``k.decode()`` raised UnicodeDecodeError: the inspection died with a traceback);
* the operator, publishing membership over such a field, removes it with a warning naming it and
  publishes the desired members (the same decode raised out of every reconcile, so membership was
  never written);
* ``prefixfleet report`` refuses a ``--fleet``/``--namespace`` ending in a newline (``$`` with
  ``re.match`` let it through into the PromQL label matchers);
* a sidecar whose engine states emulator figures that make no usable rate (a real emulator at
  1e308 prefill tokens/s and time scale 10: an infinite rate) or fixed latency, or a cache no load
  record can carry (2**64 tokens), warns once naming them and publishes its defaults instead; a
  gateway keeps it in routing (an infinite rate made every load record one that gateways refuse:
  the worker silently dropped out).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import kubernetes
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestServer
from fleet_fixtures import LOOPBACK, RedisServer, eventually

from prefixfleet.cli import main
from prefixfleet.emulator.config import EmulatorConfig
from prefixfleet.emulator.server import EmulatorServer
from prefixfleet.operator.handlers import OperatorContext, ReconcileOutcome, publish_membership
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.models import FleetSpec
from prefixfleet.operator.planner import FleetRef, ObservedPod
from prefixfleet.router.gateway import Gateway, GatewayConfig
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.loadtrack import DEFAULT_PREFILL_TOKENS_PER_S
from prefixfleet.router.records import (
    LoadReport,
    MemberRecord,
    decode_load,
    decode_member,
    encode_record,
)
from prefixfleet.router.sidecar import Sidecar, SidecarConfig, emulated_speed

JUNK_NAMES = (b"\xffw", b"bad id!")  # not UTF-8; UTF-8 but no worker id


# -- members hash: field names that are no worker id ------------------------------------------------


def test_inspect_names_a_member_that_is_no_worker_id_and_reports_the_rest(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = FleetKeys("junk")
    client = redis_server.client()
    try:
        member = encode_record(MemberRecord(url="http://127.0.0.1:9"))
        load = LoadReport(1, 1764489612.0, "ready", True, 0, 0, 0, 12000.0, 0, 65536, 0)
        client.hset(keys.members, mapping={**dict.fromkeys(JUNK_NAMES, member), "w0": member})
        client.set(keys.load("w0"), encode_record(load))
    finally:
        client.close()
    status = main(["router", "inspect", "--redis", redis_server.url, "--fleet", "junk", "--json", "-"])
    out, err = capsys.readouterr()
    assert status == 1, err
    report = json.loads(out)
    assert [row["worker_id"] for row in report["workers"]] == ["w0"]
    assert report["workers"][0]["problems"] == ["no summary"]
    assert report["invalid_members"] == ["\ufffdw", "bad id!"] and report["healthy"] is False
    assert err.splitlines() == [
        "prefixfleet router inspect: ignoring member '\ufffdw': not a valid worker id",
        "prefixfleet router inspect: ignoring member 'bad id!': not a valid worker id",
    ]


async def test_operator_removes_a_member_that_is_no_worker_id_and_publishes_the_rest(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    spec = FleetSpec.model_validate({"model": {"name": "m"}, "engine": {"kind": "emulator"}})
    ref = FleetRef(name="chat", namespace="team-a")
    keys = FleetKeys(ref.redis_fleet)
    pods = (ObservedPod(name="chat-0", phase="Running", ready=True, pod_ip="10.0.0.1"),)
    outcome = ReconcileOutcome(fleet={}, spec=spec, ref=ref, pods=pods, redis_url=redis_server.url)
    # publish_membership talks to Redis only: the Kubernetes client is never called
    ctx = OperatorContext(kube=Kube(kubernetes.client.ApiClient()))
    client = aioredis.from_url(redis_server.url)
    logger = logging.getLogger("test.operator.membership")
    try:
        stale = encode_record(MemberRecord(url="http://10.0.0.9:8100"))
        await client.hset(keys.members, mapping={**dict.fromkeys(JUNK_NAMES, stale), "chat-gone": stale})
        with caplog.at_level(logging.WARNING, logger=logger.name):
            await publish_membership(ctx, outcome, logger)
        members = await client.hgetall(keys.members)
        assert list(members) == [b"chat-0"]
        assert decode_member(members[b"chat-0"]).url == "http://10.0.0.1:8100"
        warnings = [r.getMessage() for r in caplog.records if r.name == logger.name]
        assert warnings == [
            f"removing member '\ufffdw' from {keys.members}: not a valid worker id",
            f"removing member 'bad id!' from {keys.members}: not a valid worker id",
        ]
    finally:
        await client.aclose()
        for redis_client in ctx.redis_clients.values():
            await redis_client.aclose()


# -- prefixfleet report: names must match whole ---------------------------------------------------


@pytest.mark.parametrize("flag", ["--fleet", "--namespace"])
def test_report_refuses_a_name_ending_in_a_newline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    argv = ["report", "--prometheus", "http://127.0.0.1:1", "--out", str(tmp_path), flag, "chat\n"]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"prefixfleet report: error: {flag} must be a Kubernetes-style name, got 'chat\\n'"
    ]


# -- the engine's self-description: figures that make no usable rate -------------------------------


@pytest.mark.parametrize(
    ("figures", "refused"),
    [
        ({"prefill_tokens_per_s": 1e308, "time_scale": 10}, "prefill_tokens_per_s × time_scale = inf"),
        ({"prefill_tokens_per_s": float("nan"), "time_scale": 1}, "prefill_tokens_per_s nan"),
        ({"prefill_tokens_per_s": 10**400, "time_scale": 1}, "prefill_tokens_per_s 1000000000"),
        ({"prefill_tokens_per_s": 30000, "time_scale": 0}, "time_scale 0 "),
        ({"prefill_tokens_per_s": 30000, "time_scale": True}, "time_scale True "),
        ({"prefill_tokens_per_s": 5e-324, "time_scale": 1}, "is no usable rate"),
    ],
)
def test_emulated_speed_refuses_figures_that_make_no_usable_rate(figures: dict, refused: str) -> None:
    speed = emulated_speed(figures)
    assert speed.prefill_tokens_per_s is None
    assert len(speed.problems) == 1 and refused in speed.problems[0], speed.problems


def test_emulated_speed_divides_stated_figures_by_the_time_scale() -> None:
    figures = {
        "prefill_tokens_per_s": 30000.0,
        "time_scale": 50,
        "prefill_overhead_s": 0.01,
        "decode_step_s": 0.02,
    }
    speed = emulated_speed(figures)
    assert speed.prefill_tokens_per_s == 1_500_000.0 and speed.problems == ()
    assert speed.fixed_latency_s == pytest.approx(0.0006)
    assert emulated_speed({"engine": "not an emulator"}) == emulated_speed({})


@pytest.mark.timeout(60)
async def test_a_sidecar_refuses_an_engines_unusable_figures_and_stays_routable(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    keys = FleetKeys("figures")
    # all valid for the emulator itself, but 1e308 × 10 tokens/s is infinite, so are the fixed costs
    # over the time scale... and no load record can carry a 2**64-token cache
    config = EmulatorConfig(
        prefill_tokens_per_s=1e308,
        time_scale=10,
        prefill_overhead_s=1e308,
        decode_step_s=1e308,
        cache_tokens=2**64,
    )
    client = redis_server.client()
    async with EmulatorServer(config, port=0) as engine:
        sidecar = Sidecar(
            SidecarConfig(
                engine_url=engine.url, redis_url=redis_server.url, port=1, worker_id="w0", fleet="figures"
            )
        )
        front = TestServer(sidecar.app(), host=LOOPBACK)
        gateway = Gateway(
            GatewayConfig(port=0, redis_url=redis_server.url, fleet="figures", refresh_interval_s=0.05)
        )
        runner = web.AppRunner(gateway.app(), handle_signals=False)
        try:
            with caplog.at_level(logging.WARNING, logger="prefixfleet.sidecar"):
                await front.start_server()
                await runner.setup()

                def routed() -> bool:
                    worker = gateway.view.workers.get("w0")
                    return worker is not None and worker.load is not None and worker.load.engine_ok

                await eventually(routed, 20, "the gateway to take the worker's load record")
            raw = client.get(keys.load("w0"))
            assert raw is not None
            load = decode_load(raw)
            assert load.prefill_tokens_per_s == DEFAULT_PREFILL_TOKENS_PER_S
            assert load.fixed_latency_s == 0.0
            assert 0 < load.capacity_tokens < 2**63
            warnings = [r.getMessage() for r in caplog.records if r.name == "prefixfleet.sidecar"]
            assert warnings == [
                f"engine {engine.url}: ignoring max_total_num_tokens 18446744073709551616 (over {2**63 - 1})",
                f"engine {engine.url}: ignoring emulator figures "
                "(the defaults stand until requests measure): "
                "prefill_tokens_per_s × time_scale = inf is no usable rate; "
                "(prefill_overhead_s + decode_step_s) / time_scale = inf is not finite",
            ]
        finally:
            await runner.cleanup()
            await front.close()
            client.close()
