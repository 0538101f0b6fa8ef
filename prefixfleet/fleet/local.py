"""The local fleet: embedded Redis, N emulated engines each behind its sidecar, M gateways.

:class:`LocalFleet` owns the topology (which processes, which ports, in what order) on top of a
:class:`~prefixfleet.fleet.processes.Supervisor`; :func:`run_up` drives the ``prefixfleet up``
benchmark: one workload, replayed through the gateways once per routing policy, with every engine
cache, sidecar tree and Redis summary reset between policies so no policy inherits another's cache.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from redis.exceptions import RedisError

from prefixfleet.cli import counted
from prefixfleet.emulator.config import EmulatorConfig
from prefixfleet.emulator.vllm_api import DEFAULT_BLOCK_SIZE, DEV_MODE_ENV
from prefixfleet.fleet.load import LoadRun, requests_from_workload, run_load
from prefixfleet.fleet.processes import (
    LOOPBACK,
    Child,
    ChildFailedError,
    RedisEndpoint,
    Supervisor,
    start_redis,
)
from prefixfleet.fleet.ranking import compare_rankings, compare_resolved
from prefixfleet.fleet.reaper import ReplicaReaper
from prefixfleet.router.control import control_headers, fleet_control_token
from prefixfleet.router.engine_api import SGLANG, VLLM
from prefixfleet.router.gateway import GatewayConfig
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.policies import CostModel, make_policy
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.records import LoadReport, SummaryError, decode_load
from prefixfleet.router.redis_conn import connect_redis
from prefixfleet.router.sidecar import SidecarConfig
from prefixfleet.router.view import OVERLAY_SUMMARY_SLACK_S
from prefixfleet.sim.engine import EmulatedReplica, ServiceConfig
from prefixfleet.sim.report import summarize as summarize_sim
from prefixfleet.sim.simulator import FleetConfig, simulate
from prefixfleet.tokenizer import text_for_tokens, tokenize

FLEET_NAME = "local"
REPLICA_ROLES = ("engine", "sidecar")  # a replica's processes are named <role>-<index>
# The HTTP API the emulated engines speak: SGLang's (the emulator's default) or vLLM's (`emulator
# --api vllm`); the sidecars are told which (`router sidecar --engine-api`).
ENGINE_APIS = (SGLANG, VLLM)
# vLLM's KV block size the vLLM-API emulators run with (the emulator's and vLLM's default): vLLM
# caches, and reports cached, whole blocks only, and its KV pool is a whole number of blocks.
VLLM_BLOCK_TOKENS = DEFAULT_BLOCK_SIZE
# vLLM serves POST /reset_prefix_cache only in dev mode; the fleet flushes every engine's cache
# between policies through it (the sidecar's /flush_cache). Safe here: every process listens on
# 127.0.0.1. (The operator leaves it off: docs/operator.md.)
VLLM_DEV_MODE_ENV = {DEV_MODE_ENV: "1"}


# The sidecar's control route that forgets its traffic rates (router/sidecar.py handle_reset_rates)
RESET_RATES_PATH = "/prefixfleet/reset_rates"


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """How each emulated engine is configured (None: the emulator's own default)."""

    model: str = "emulated-llm"
    cache_tokens: int | None = None
    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    max_running: int | None = None
    time_scale: float = 1.0
    api: str = "sglang"  # one of ENGINE_APIS


@dataclass(frozen=True, slots=True)
class FleetSpec:
    replicas: int = 4
    gateways: int = 2
    engine: EngineSettings = field(default_factory=EngineSettings)
    fleet_name: str = FLEET_NAME

    @property
    def router_prefill_tokens_per_s(self) -> float | None:
        """The engines' prefill speed in wall-clock tokens/s, as an operator would configure it.

        Sidecars and gateways start from this estimate (then measure); it is the modelled rate
        sped up by the time scale, since they see wall-clock time.
        """
        rate = self.engine.prefill_tokens_per_s
        return None if rate is None else rate * self.engine.time_scale

    def problems(self) -> list[str]:
        out = []
        if self.replicas < 1:
            out.append(f"--replicas must be at least 1, got {self.replicas}")
        if self.gateways < 1:
            out.append(f"--gateways must be at least 1, got {self.gateways}")
        if self.engine.time_scale <= 0:
            out.append(f"--time-scale must be positive, got {self.engine.time_scale}")
        if self.engine.cache_tokens is not None and self.engine.cache_tokens < 2:
            out.append(f"--cache-tokens must be at least 2, got {self.engine.cache_tokens}")
        if self.engine.api not in ENGINE_APIS:
            out.append(f"--engine-api must be one of {', '.join(ENGINE_APIS)}, got {self.engine.api!r}")
        elif self.engine.api == "vllm" and (self.engine.cache_tokens or 0) % VLLM_BLOCK_TOKENS:
            out.append(
                f"--cache-tokens must be a multiple of vLLM's block size {VLLM_BLOCK_TOKENS} with"
                f" --engine-api vllm (its KV pool is whole blocks), got {self.engine.cache_tokens}"
            )
        return out


def _cli(*args: str) -> list[str]:
    # The same interpreter that runs us (a venv works without PATH changes); the child entry point
    # is `prefixfleet <args>` importing only the command it runs.
    return [sys.executable, "-m", "prefixfleet.fleet.child", *args]


def emulator_argv(port: int, engine: EngineSettings) -> list[str]:
    # --enable-cache-report (SGLang) / --enable-prompt-tokens-details (vLLM): OpenAI answers then
    # report cached tokens, which the sidecar's mirror corrects itself from and `load` counts hits by.
    vllm = engine.api == "vllm"
    reported = ["--api", "vllm", "--enable-prompt-tokens-details"] if vllm else ["--enable-cache-report"]
    argv = _cli("emulator", "--host", LOOPBACK, "--port", str(port), "--model", engine.model, *reported)
    optional = {
        "--cache-tokens": engine.cache_tokens,
        "--prefill-tokens-per-s": engine.prefill_tokens_per_s,
        "--decode-tokens-per-s": engine.decode_tokens_per_s,
        "--max-running": engine.max_running,
    }
    for flag, value in optional.items():
        if value is not None:
            argv += [flag, str(value)]
    return [*argv, "--time-scale", str(engine.time_scale)]


def _rate_flag(rate: float | None) -> list[str]:
    return [] if rate is None else ["--prefill-tokens-per-s", f"{rate:g}"]


def emulator_env(engine: EngineSettings) -> dict[str, str] | None:
    """What an emulated engine's environment adds to ours: vLLM's dev mode for the flush."""
    return dict(VLLM_DEV_MODE_ENV) if engine.api == "vllm" else None


def sidecar_argv(
    port: int,
    engine_url: str,
    redis_url: str,
    worker_id: str,
    fleet: str,
    prefill_tokens_per_s: float | None,
    engine_api: str = "sglang",
) -> list[str]:
    return [*_cli(
        "router", "sidecar",
        "--engine", engine_url,
        "--engine-api", engine_api,
        "--redis", redis_url,
        "--host", LOOPBACK,
        "--port", str(port),
        "--worker-id", worker_id,
        "--advertise-url", f"http://{LOOPBACK}:{port}",
        "--fleet", fleet,
        "--self-register",
    ), *_rate_flag(prefill_tokens_per_s)]  # fmt: skip


def gateway_argv(
    port: int, redis_url: str, policy: str, fleet: str, prefill_tokens_per_s: float | None
) -> list[str]:
    return [*_cli(
        "router", "gateway",
        "--redis", redis_url,
        "--host", LOOPBACK,
        "--port", str(port),
        "--fleet", fleet,
        "--policy", policy,
    ), *_rate_flag(prefill_tokens_per_s)]  # fmt: skip


@dataclass(slots=True)
class Replica:
    index: int
    engine: Child
    engine_url: str
    sidecar: Child | None = None
    sidecar_url: str | None = None

    @property
    def worker_id(self) -> str:
        return f"replica-{self.index}"


def replica_process_name(role: str, index: int) -> str:
    return f"{role}-{index}"


class LocalFleet:
    """Starts and resets the fleet's processes; everything it starts is owned by ``supervisor``."""

    def __init__(self, supervisor: Supervisor, spec: FleetSpec) -> None:
        self.sup = supervisor
        self.spec = spec
        self.redis: RedisEndpoint | None = None
        self.replicas: list[Replica] = []
        self.gateways: list[Child] = []

    @property
    def engine_urls(self) -> list[str]:
        return [r.engine_url for r in self.replicas]

    @property
    def sidecar_urls(self) -> list[str]:
        return [r.sidecar_url for r in self.replicas if r.sidecar_url]

    @property
    def gateway_urls(self) -> list[str]:
        return [g.url for g in self.gateways if g.url]

    @property
    def redis_url(self) -> str:
        if self.redis is None:
            raise RuntimeError("the fleet's Redis is not started")
        return self.redis.url

    async def control_headers(self) -> dict[str, str]:
        """The header of a request to a sidecar's control routes (``/prefixfleet/state``...) or, through
        it, to an engine's admin routes (``/flush_cache``): the fleet's token (:mod:`.router.control`),
        read from the fleet's Redis as every member does, at each use (a rotation holds at once)."""
        client = connect_redis(self.redis_url, timeout_s=2.0)
        try:
            return control_headers(await fleet_control_token(client, FleetKeys(self.spec.fleet_name)))
        except (RedisError, OSError):
            self.sup.check_alive()  # a dead Redis is named, with its log, rather than as a refused connection
            raise
        finally:
            await client.aclose()

    async def start_engines(self) -> None:
        """Redis, then every emulator (in parallel), then every sidecar (in parallel)."""
        self.redis = await start_redis(self.sup)
        engines = await asyncio.gather(*(self._start_engine(i) for i in range(self.spec.replicas)))
        self.replicas = list(engines)
        await self.start_sidecars()

    @staticmethod
    def is_replica_process(child: Child) -> bool:
        """Whether ``child`` is some replica's engine or sidecar (by its name)."""
        role, _, index = child.name.partition("-")
        return role in REPLICA_ROLES and index.isdigit()

    def add_replica(self, replica: Replica) -> None:
        """Put a started replica in the fleet, in index order."""
        self.replicas.append(replica)
        self.replicas.sort(key=lambda r: r.index)

    async def start_replica(self, index: int) -> Replica:
        """Start ``replica-<index>``: its engine, then its sidecar (the engine is stopped if the sidecar
        fails). The caller decides where it goes in :attr:`replicas`."""
        replica = await self._start_engine(index)
        try:
            await self._start_sidecar(replica)
        except BaseException:
            await self.sup.stop(replica.engine)
            raise
        return replica

    async def stop_replica(self, replica: Replica) -> None:
        """Stop a replica's sidecar (which deregisters itself on the way out), then its engine."""
        if replica.sidecar is not None:
            await self.sup.stop(replica.sidecar)
        await self.sup.stop(replica.engine)

    async def _start_engine(self, index: int) -> Replica:
        port = self.sup.allocate_port()
        url = f"http://{LOOPBACK}:{port}"
        child = await self.sup.start(
            replica_process_name("engine", index),
            emulator_argv(port, self.spec.engine),
            health_url=f"{url}/health",
            url=url,
            env=emulator_env(self.spec.engine),
        )
        return Replica(index, child, url)

    async def start_sidecars(self) -> None:
        await asyncio.gather(*(self._start_sidecar(r) for r in self.replicas))

    async def _start_sidecar(self, replica: Replica) -> None:
        port = self.sup.allocate_port()
        url = f"http://{LOOPBACK}:{port}"
        argv = sidecar_argv(
            port,
            replica.engine_url,
            self.redis_url,
            replica.worker_id,
            self.spec.fleet_name,
            self.spec.router_prefill_tokens_per_s,
            self.spec.engine.api,
        )
        replica.sidecar = await self.sup.start(
            replica_process_name("sidecar", replica.index), argv, health_url=f"{url}/health", url=url
        )
        replica.sidecar_url = url

    async def start_gateways(self, policy: str) -> None:
        await self.stop_gateways()
        self.gateways = list(
            await asyncio.gather(*(self._start_gateway(i, policy) for i in range(self.spec.gateways)))
        )
        await self.wait_for_membership()

    async def _start_gateway(self, index: int, policy: str) -> Child:
        port = self.sup.allocate_port()
        url = f"http://{LOOPBACK}:{port}"
        argv = gateway_argv(
            port, self.redis_url, policy, self.spec.fleet_name, self.spec.router_prefill_tokens_per_s
        )
        return await self.sup.start(f"gateway-{index}-{policy}", argv, health_url=f"{url}/health", url=url)

    async def stop_gateways(self) -> None:
        gateways, self.gateways = self.gateways, []
        for gateway in gateways:
            await self.sup.stop(gateway)

    async def wait_for_membership(self, timeout_s: float = 30.0) -> None:
        """Until every gateway reports all replicas as routable workers."""
        want = len(self.replicas)
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as session:
            for gateway in self.gateways:
                url = gateway.url
                while url:
                    have = await _gateway_worker_count(session, url)
                    if have is None or have >= want:
                        break
                    if time.monotonic() > deadline:
                        # which gateway, and its log: it says why it left a worker out
                        raise ChildFailedError(
                            gateway.name,
                            f"{url} sees {have} of {counted(want, 'worker')} after {timeout_s:.0f}s",
                            gateway.log_tail(),
                            gateway.log_path,
                        )
                    self.sup.check_alive()
                    await asyncio.sleep(0.1)

    async def reset(self) -> None:
        """A cold fleet: no gateway, empty engine caches and sidecar mirrors, no traffic rates.

        The flush goes through each sidecar when there is one: the sidecar forwards it to its engine
        and, on success, empties its own mirror and republishes its (now empty) summary.
        """
        await self.stop_gateways()
        targets = [
            (r.sidecar, r.sidecar_url) if r.sidecar and r.sidecar_url else (r.engine, r.engine_url)
            for r in self.replicas
        ]
        # an engine without a sidecar ignores the header; a sidecar refuses an admin route without it
        async with aiohttp.ClientSession(headers=await self.control_headers()) as session:
            check = self.sup.check_alive
            await asyncio.gather(
                *(_post_until_ok(session, child, url, "/flush_cache", check) for child, url in targets)
            )
            # The sidecars outlive the flush, and with them the arrival and cache-write rates they
            # publish (queue_aware reads them): forgotten too, or the next policy starts with this one's.
            sidecars = [(r.sidecar, r.sidecar_url) for r in self.replicas if r.sidecar and r.sidecar_url]
            await asyncio.gather(
                *(_post_until_ok(session, child, url, RESET_RATES_PATH, check) for child, url in sidecars)
            )
        await self._wait_for_quiet_rates([r for r in self.replicas if r.sidecar and r.sidecar_url])

    async def _wait_for_quiet_rates(self, replicas: Sequence[Replica], timeout_s: float = 10.0) -> None:
        """Until the load record of each replica in Redis (what a starting gateway reads) carries no
        traffic rate: a sidecar writes its record every publish_interval_s (0.25 s)."""
        keys = FleetKeys(self.spec.fleet_name)
        client = connect_redis(self.redis_url, timeout_s=2.0)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                raws = await client.mget([keys.load(r.worker_id) for r in replicas]) if replicas else []
                # a missing record holds no rate to read; a dead replica is the reaper's (or check_alive's)
                loud = [
                    (r, raw)
                    for r, raw in zip(replicas, raws, strict=True)
                    if raw is not None
                    and r.sidecar is not None
                    and r.sidecar.running
                    and not _quiet_record(raw)
                ]
                if not loud:
                    return
                self.sup.check_alive()
                if time.monotonic() >= deadline:
                    replica, raw = loud[0]
                    assert replica.sidecar is not None
                    raise ChildFailedError(
                        replica.sidecar.name,
                        f"{replica.sidecar_url} still published traffic rates {timeout_s:g} s after "
                        f"{RESET_RATES_PATH}: {raw!r}",
                        replica.sidecar.log_tail(),
                        replica.sidecar.log_path,
                    )
                await asyncio.sleep(0.05)
        except (RedisError, OSError):
            self.sup.check_alive()  # a dead Redis is named, with its log
            raise
        finally:
            await client.aclose()


def rates_are_quiet(report: LoadReport) -> bool:
    """Whether a load record carries no traffic rate (none published, or the zeros a reset leaves)."""
    return not report.arrivals_per_s and not report.write_tokens_per_s


def _quiet_record(raw: bytes | str) -> bool:
    try:
        return rates_are_quiet(decode_load(raw))
    except SummaryError:
        return False  # not a record a gateway would use either, but named if it stays


async def _gateway_worker_count(session: aiohttp.ClientSession, url: str) -> int | None:
    """Workers a gateway can route to, from its /health JSON (None if it does not say)."""
    try:
        async with session.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=2)) as resp:
            payload = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return 0
    if not isinstance(payload, dict):
        return None
    for key in ("routable_workers", "workers"):
        value = payload.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, list):
            return len(value)
    return None


async def _post_until_ok(
    session: aiohttp.ClientSession, child: Child, url: str, path: str, check_alive: Callable[[], None]
) -> None:
    """POST ``path`` to ``child`` (a sidecar, or an engine without one) at ``url`` until it answers 200:
    ``/flush_cache`` empties its cache."""
    for _ in range(100):  # an engine refuses (400) while requests are still running
        try:
            async with session.post(f"{url}{path}", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                if resp.status == 200:
                    return
        except (aiohttp.ClientError, TimeoutError):
            pass  # retried below
        # A dead process of the fleet is named now, with its log (not as this refusal 10 s later);
        # a dead replica someone else handles (the reaper, while the fleet is held) has nothing to flush.
        check_alive()
        if not child.running:
            return
        await asyncio.sleep(0.1)
    raise ChildFailedError(
        child.name, f"{url} kept refusing {path} for 10 s", child.log_tail(), child.log_path
    )


# -- the `up` benchmark ------------------------------------------------------------------------------

# The emulator's own timing defaults, mirrored into the simulator's batched service model so the sim
# check runs the same engine model the live fleet runs.
_EMULATOR_DEFAULTS = EmulatorConfig()
# How the gateways learn about the engines, in wall seconds, for the simulator's emulator model: a
# request reaches its sidecar and engine ~4 ms after the gateway sent it (measured on a busy 2-core
# machine: client send to the sidecar's load push, median 4.6 ms, p90 23 ms; exponential in the
# simulator); a sidecar pushes a load change at most every push_min_interval_s and gateways see it
# ~2 ms later (measured median 2.1 ms); it publishes its mirror's summary every publish_interval_s,
# which a gateway fetches at its next refresh (on average half an interval later) and then still
# counts its own sends from up to OVERLAY_SUMMARY_SLACK_S before it.
_SIDECAR = {f.name: f.default for f in fields(SidecarConfig)}
_GATEWAY = {f.name: f.default for f in fields(GatewayConfig)}
SIM_REALIZATIONS = 8
LIVE_VIEW_TIMING: dict[str, Any] = {
    "report_gap_s": _SIDECAR["push_min_interval_s"],
    "report_delay_s": 0.002,
    "summary_interval_s": _SIDECAR["publish_interval_s"],
    "summary_delay_s": _GATEWAY["refresh_interval_s"] / 2,
    "overlay_slack_s": OVERLAY_SUMMARY_SLACK_S,
    "forward_delay_s": 0.004,
    # gateways publish their sends (send notices) in batches gathered for up to 10 ms
    # (router/gateway.py _SHARE_COALESCE_S): seen on average ~5 ms + ~2 ms of delivery later
    "share_sends": True,
    "share_delay_s": 0.007,
    # sidecars publish their worker's arrival and cache-write rates in each load record (3eb11bf)
    "report_rates": True,
}


def token_scale(workload: Any) -> float:
    """How much a workload's prompts were shrunk (trace ``block_tokens`` / ``trace_block_tokens``)."""
    s = workload.settings
    if "block_tokens" in s and "trace_block_tokens" in s:
        return float(s["block_tokens"]) / float(s["trace_block_tokens"])
    return 1.0


def engine_for_workload(
    workload: Any,
    replicas: int,
    *,
    time_scale: float,
    cache_tokens: int | None = None,
    prefill_tokens_per_s: float | None = None,
    output_tokens: int = 64,
    api: str = "sglang",
) -> EngineSettings:
    """Engines equivalent to the fleet the workload is judged at (its ``recommended`` settings).

    The recommended fleet's total cache and prefill capacity are spread over ``replicas`` engines,
    and both shrink with the prompts of a scaled-down trace (the cache also with the share of groups
    sampled), so modelled prefill seconds per request and the fleet's cache-to-working-set ratio
    stay those of the full-size workload. The cache is never smaller than the longest prompt plus
    ``output_tokens``; for vLLM-API engines (``api``) a derived one is rounded up to whole blocks of
    :data:`VLLM_BLOCK_TOKENS`, as vLLM's KV pool is (a given one is left for
    :meth:`FleetSpec.problems` to judge).
    """
    rec = workload.recommended
    base_replicas = int(rec.get("replicas", replicas))
    merge = base_replicas / replicas
    scale = token_scale(workload)
    if cache_tokens is None:
        # A group-sampled trace touches only ``sampled_fraction`` of the distinct prefixes on a
        # timeline compressed by that fraction: the cache shrinks alike so it holds the same share
        # of the working set (the same reuse distance in requests) as at full size.
        sampled = float(workload.settings.get("sampled_fraction", 1.0))
        full = int(rec.get("cache_tokens", 200_000))
        # Never below what the longest request needs in the KV pool, or the engine must refuse it.
        longest = max((r.num_tokens for r in workload.requests), default=0)
        cache_tokens = max(longest + output_tokens + 1, round(full * scale * merge * sampled))
        if api == "vllm":
            cache_tokens = -(-cache_tokens // VLLM_BLOCK_TOKENS) * VLLM_BLOCK_TOKENS
    if prefill_tokens_per_s is None:
        per_token = float(rec.get("prefill_s_per_token", 1.0 / _EMULATOR_DEFAULTS.prefill_tokens_per_s))
        prefill_tokens_per_s = round(scale * merge / per_token, 3)
    return EngineSettings(
        cache_tokens=cache_tokens, prefill_tokens_per_s=prefill_tokens_per_s, time_scale=time_scale, api=api
    )


def sim_service(engine: EngineSettings) -> ServiceConfig:
    """The simulator's model of these engines: the emulator's own scheduler with their timing.

    Modelled seconds, as the engines report them (:func:`simulate_policies` runs it on the live
    fleet's wall clock).
    """
    rate = engine.prefill_tokens_per_s or _EMULATOR_DEFAULTS.prefill_tokens_per_s
    decode_step = (
        1.0 / engine.decode_tokens_per_s if engine.decode_tokens_per_s else _EMULATOR_DEFAULTS.decode_step_s
    )
    return ServiceConfig(
        service="emulator",
        prefill_s_per_token=1.0 / rate,
        cached_s_per_token=_EMULATOR_DEFAULTS.cached_token_cost_s,
        prefill_pass_s=_EMULATOR_DEFAULTS.prefill_overhead_s,
        max_running=engine.max_running or _EMULATOR_DEFAULTS.max_running,
        step_token_budget=_EMULATOR_DEFAULTS.chunk_tokens,
        decode_base_s=decode_step,
        decode_s_per_seq=_EMULATOR_DEFAULTS.decode_step_per_req_s,
    )


@dataclass(frozen=True, slots=True)
class UpOptions:
    policies: tuple[str, ...]
    requests: int = 600
    max_output_tokens: int = 4
    concurrency: int = 512
    timeout_s: float = 120.0
    run_dir: Path = Path("out/fleet-run")
    progress: bool = True
    sim_check: bool = True
    # While the fleet is held after the runs, a replica that died is restarted once (False: the
    # autoscaler replaces it); either way it leaves the membership (prefixfleet.fleet.reaper).
    restart_dead_replicas: bool = True


@dataclass(slots=True)
class PolicyRun:
    policy: str
    run: LoadRun

    def row(self) -> dict[str, Any]:
        s = self.run.summary
        return {
            "mean_ttft_ms": s.mean_ttft_ms,
            "p50_ttft_ms": s.p50_ttft_ms,
            "p99_ttft_ms": s.p99_ttft_ms,
            "hit_rate": s.hit_rate,
            "errors": s.errors,
            "requests": s.requests,
            "throughput_rps": s.throughput_rps,
            "mean_client_lag_ms": s.mean_client_lag_ms,
            "error_kinds": s.error_kinds,
        }


def workload_slice(workload: Any, requests: int, max_output_tokens: int | None) -> list[Any]:
    """The first ``requests`` requests (0: all), outputs capped: what both the sim and the client replay."""
    chosen = workload.requests[:requests] if requests else list(workload.requests)
    if max_output_tokens is None:
        return list(chosen)
    return [replace(r, output_tokens=max(1, min(r.output_tokens, max_output_tokens))) for r in chosen]


async def run_policies(
    fleet: LocalFleet,
    requests: Sequence[Any],
    policies: Sequence[str],
    options: UpOptions,
) -> list[PolicyRun]:
    """Each policy on a cold fleet: reset, gateways with that policy, replay through all gateways."""
    out = []
    for policy in policies:
        await fleet.reset()
        await fleet.start_gateways(policy)
        replay = run_load(
            requests,
            fleet.gateway_urls,
            api="openai",
            speedup=fleet.spec.engine.time_scale,  # replay on the engines' clock
            concurrency=options.concurrency,
            timeout_s=options.timeout_s,
            progress=options.progress,
            desc=f"up {policy}",
        )
        run = await fleet.sup.while_alive(replay)
        out.append(PolicyRun(policy, run))
    return out


def live_tokens(prompts: Sequence[bytes]) -> list[bytes]:
    """The token ids the fleet sees for workload prompts: the client sends each as text
    (:func:`~prefixfleet.fleet.load.requests_from_workload`) and every hop tokenizes that text. The
    sharing structure is the workload's, the ids are not, and hash-based choices (a policy's
    placement of a prefix nobody holds) depend on the ids. One word per token, so each distinct
    id is mapped once, for all prompts together."""
    if not prompts:
        return []
    ids = np.frombuffer(b"".join(prompts), dtype="<u4")
    # distinct ids by sorting (numpy's hash-based unique is far slower on millions of ids)
    order = np.argsort(ids, kind="stable")
    ranked = ids[order]
    first = np.empty(len(ranked), dtype=bool)
    first[:1] = True
    np.not_equal(ranked[1:], ranked[:-1], out=first[1:])
    group = np.empty(len(ids), dtype=np.int64)
    group[order] = np.cumsum(first) - 1
    mapped = np.frombuffer(as_token_bytes(tokenize(text_for_tokens(ranked[first].tolist()))), dtype="<u4")
    out = mapped[group].astype("<u4").tobytes()
    ends = np.cumsum([len(p) for p in prompts]).tolist()
    return [out[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]


def simulate_policies(
    requests: Sequence[Any],
    policies: Sequence[str],
    spec: FleetSpec,
    *,
    carry_sidecars: bool = True,
    realizations: int = SIM_REALIZATIONS,
) -> dict[str, dict[str, Any]]:
    """The same requests through the simulator with the emulator's scheduler and the same fleet shape.

    The simulator gets the token ids the fleet sees (:func:`live_tokens`) and runs on the live fleet's
    wall clock (engine durations and arrival gaps divided by the time scale) because the gateways'
    policies do: their constants (a load slack in seconds, rate windows, eviction intervals) and
    their cost model are wall-clock, and a sidecar reports wall-clock prefill rates. Policies run
    in the given order and, with ``carry_sidecars``, each starts with what the sidecars measured
    during the one before (prefill rate, fixed latency), as live: :meth:`LocalFleet.reset` flushes
    the caches and restarts the gateways, not the sidecars.

    Load-sensitive policies turn a few milliseconds of forwarding delay into different placements,
    so one run is one draw of a chaotic process. The fleet is simulated ``realizations`` times
    with seeded random forwarding delays (0: once, with the mean delay). Per request, the figures are
    averaged over the draws. The TTFTs and percentiles are in modelled ms.
    """
    scale = spec.engine.time_scale
    service = replace(sim_service(spec.engine).scaled_time(1.0 / scale), **LIVE_VIEW_TIMING)
    fleet = FleetConfig(spec.replicas, spec.engine.cache_tokens or _EMULATOR_DEFAULTS.cache_tokens, service)
    # An engine refuses a request its KV pool cannot hold (live: an error, no TTFT): leave it out.
    served = [
        i for i, r in enumerate(requests) if r.num_tokens + max(r.output_tokens, 1) <= fleet.cache_tokens
    ]
    kept = [requests[i] for i in served]
    on_wall_clock = [
        replace(r, arrival_s=r.arrival_s / scale, tokens=tokens)
        for r, tokens in zip(kept, live_tokens([r.tokens for r in kept]), strict=True)
    ]
    # What a gateway starts from: the configured engine speed in wall-clock tokens/s, nothing else.
    cost = CostModel(prefill_s_per_token=service.prefill_s_per_token)
    draws: dict[str, list[Any]] = {name: [] for name in policies}
    for draw in range(max(realizations, 1)):
        earlier: list[EmulatedReplica] = []
        for name in policies:
            # One policy instance per gateway: live, each gateway keeps its own routing state.
            routers = [make_policy(name, cost) for _ in range(spec.gateways)]
            replicas = [
                EmulatedReplica(
                    i,
                    fleet.cache_tokens,
                    service,
                    rng=random.Random(f"{draw}/{name}/{i}") if realizations else None,
                )
                for i in range(spec.replicas)
            ]
            if carry_sidecars:
                for replica, before in zip(replicas, earlier, strict=False):
                    replica.carry_sidecar_from(before)
            draws[name].append(simulate(on_wall_clock, routers, fleet, progress=False, replicas=replicas))
            earlier = replicas
    out = {}
    for name, runs in draws.items():
        n = len(runs)
        if not on_wall_clock:
            out[name] = {"mean_ttft_ms": math.nan, "p50_ttft_ms": math.nan, "p99_ttft_ms": math.nan}
            out[name] |= {"hit_rate": 0.0, "ttft_ms_by_request": [math.nan] * len(requests)}
            out[name]["realizations"] = n
            continue
        # Per request: the mean TTFT (modelled seconds) and cached tokens over the draws.
        averaged = replace(
            runs[0],
            ttft_s=[scale * sum(ts) / n for ts in zip(*(r.ttft_s for r in runs), strict=True)],
            cached_tokens=[round(sum(cs) / n) for cs in zip(*(r.cached_tokens for r in runs), strict=True)],
        )
        m = summarize_sim(averaged)
        out[name] = {k: m[k] for k in ("mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "hit_rate")}
        by_request = [math.nan] * len(requests)
        for i, t in zip(served, averaged.ttft_s, strict=True):
            by_request[i] = t * 1000.0
        out[name]["ttft_ms_by_request"] = by_request
        out[name]["realizations"] = n
    return out


def live_ttfts_by_request(run: LoadRun) -> list[float]:
    """Each request's TTFT in ms by its index in the replayed list (NaN where it failed)."""
    out = [math.nan] * len(run.outcomes)
    for o in run.outcomes:
        if o.ok and o.ttft_s is not None and 0 <= o.index < len(out):
            out[o.index] = o.ttft_s * 1000.0
    return out


def up_report(
    workload: Any,
    spec: FleetSpec,
    options: UpOptions,
    runs: Sequence[PolicyRun],
    sim: Mapping[str, Mapping[str, Any]] | None,
) -> dict[str, Any]:
    live = {r.policy: r.row() for r in runs}
    report: dict[str, Any] = {
        "workload": workload.name,
        "settings": {
            "replicas": spec.replicas,
            "gateways": spec.gateways,
            "requests": len(runs[0].run.outcomes) if runs else 0,
            "max_output_tokens": options.max_output_tokens,
            "engine": asdict(spec.engine),
            "workload": {k: v for k, v in workload.settings.items() if k != "path"},
            "ttft": "wall-clock ms at the client; engine durations are modelled seconds / time_scale",
        },
        "policies": live,
    }
    if sim is not None:
        sim_rows = {n: {k: v for k, v in m.items() if k != "ttft_ms_by_request"} for n, m in sim.items()}
        report["sim"] = {
            "policies": sim_rows,
            "ttft": "modelled ms (divide by time_scale to compare with the live wall-clock figures)",
            "agreement": compare_rankings(sim_rows, live) if len(live) > 1 else None,
        }
        if len(live) > 1:
            # Which of those order differences each measurement can resolve at all (ties = noise).
            report["sim"]["resolved_agreement"] = compare_resolved(
                {n: m["ttft_ms_by_request"] for n, m in sim.items()},
                {r.policy: live_ttfts_by_request(r.run) for r in runs},
                sim_rows,
                live,
            )
    return report


def machine_load() -> dict[str, Any]:
    """CPU count and 1-minute load average: timings on a shared small machine need this context."""
    try:
        load1 = round(os.getloadavg()[0], 2)
    except OSError:
        load1 = None
    return {"cpus": os.cpu_count(), "loadavg_1m": load1}


def up_sim(workload: Any, spec: FleetSpec, options: UpOptions) -> dict[str, dict[str, Any]] | None:
    """The simulator's run of the requests :func:`run_up` replays (None without ``options.sim_check``).

    Seconds to tens of seconds of CPU with no await in them: run it before the event loop starts,
    where a Ctrl-C interrupts it at once (inside the loop, Ctrl-C only cancels the task, which waits
    for the simulation's end)."""
    if not options.sim_check:
        return None
    chosen = workload_slice(workload, options.requests, options.max_output_tokens)
    return simulate_policies(chosen, options.policies, spec)


async def run_up(
    workload: Any,
    spec: FleetSpec,
    options: UpOptions,
    hold: Callable[[LocalFleet, dict[str, Any]], Awaitable[None]] | None = None,
    on_results: Callable[[dict[str, Any], list[PolicyRun]], None] | None = None,
    sim: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[dict[str, Any], list[PolicyRun]]:
    """Start the fleet and run every policy; ``hold`` runs before teardown, with replicas that die
    meanwhile reaped (:class:`~prefixfleet.fleet.reaper.ReplicaReaper`). ``sim`` is :func:`up_sim`'s
    result, compared with the live runs in the report (None: no comparison).

    ``on_results`` gets the report and runs as soon as they exist, before ``hold``: a hold ends only
    by Ctrl-C or SIGTERM, which never return them to the caller."""
    chosen = workload_slice(workload, options.requests, options.max_output_tokens)
    requests = requests_from_workload(replace(workload, requests=chosen))
    before = machine_load()
    async with Supervisor(options.run_dir) as sup:
        fleet = LocalFleet(sup, spec)
        await fleet.start_engines()
        runs = await run_policies(fleet, requests, options.policies, options)
        await fleet.stop_gateways()
        report = up_report(workload, spec, options, runs, sim)
        report["settings"]["machine"] = {"before": before, "after": machine_load()}
        if on_results is not None:
            on_results(report, runs)
        if hold is not None:
            reaper = ReplicaReaper(fleet, restart=options.restart_dead_replicas)
            async with reaper.running():
                await hold(fleet, report)
    return report, runs
