"""kopf handlers of the PrefixCacheFleet operator: a thin shell around the pure planner.

Every trigger — create/update/resume of a fleet, the periodic timer, any event of one of its replica
pods — runs the same level-based :func:`reconcile` of that fleet: read the fleet and its children,
``plan_reconcile``, execute (create-if-absent with explicit names, delete, replace changed router
children), patch status when it changed, publish membership to Redis, post Events. Nothing depends on
what happened before, so a restart mid-reconcile just reconciles again (no duplicates: names are
deterministic and a 409 on create counts as done).

Reconciles of one fleet are serialised by a lock, and triggers arriving while one is already queued
coalesce into it. Kubernetes calls are synchronous (``kube.Kube``) and run in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, get_args
from urllib.parse import urlsplit

import kopf
import redis
import redis.asyncio as aioredis
from kubernetes.client.rest import ApiException
from prometheus_client import Counter, Gauge
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    NoPermissionError,
    RedisError,
    ResponseError,
)

from prefixfleet.router.addresses import redis_url_error
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.records import MemberRecord, decode_load, split_member_fields
from prefixfleet.router.redis_conn import redacted, with_credentials
from prefixfleet.router.summary import SummaryError

from .kube import REFUSAL_STATUSES, ChildRefused, Kube, load_api_client
from .last_applied import with_last_applied
from .membership import desired_members, plan_membership
from .models import GROUP, PLURAL, VERSION, FleetSpec, InvalidFleetSpec, validate_spec
from .planner import (
    ANNOTATION_DRAINING_SINCE,
    ANNOTATION_FIRST_READY,
    ANNOTATION_SPEC_HASH,
    ANNOTATION_STATE,
    ANNOTATION_UNREADY_SEEN,
    LABEL_MANAGED_BY,
    LABEL_ROLE,
    MANAGER,
    MIN_DRAIN_S,
    FleetRef,
    ObservedLabels,
    ObservedPod,
    ObservedState,
    PlannedEvent,
    UnhealthyReason,
    UnhealthyReplica,
    events_carried_out,
    observe_labels,
    observe_pod,
    plan_invalid_spec,
    plan_reconcile,
    redis_password_warning,
    redis_verdict,
    refused_verdict,
    replica_name,
    replica_selector,
    router_name,
    status_changes,
    unavailable_while_invalid,
)
from .redis_permissions import (
    AUTH_REFUSALS,
    NoPasswordSet,
    ProbeAnswer,
    RedisRefused,
    acl_user,
    discard_hint,
    fleet_commands,
    login,
    permission_problem,
    probe_commands,
    redis_error_text,
    refusal_problem,
)
from .refusals import refusal_events, try_next_create, with_refusals

FLEET_RESOURCE = {"group": GROUP, "version": VERSION, "plural": PLURAL}
RECONCILE_INTERVAL_S = float(os.environ.get("PREFIXFLEET_RECONCILE_INTERVAL", "10"))
# The autoscaler's scale-down preference: comma-separated pod names on the fleet, most preferred first.
ANNOTATION_VICTIMS = "prefixfleet.io/victims"
FINALIZER = "prefixfleet.io/cleanup"
# A deleted fleet keeps FINALIZER until its timers (fleet_timer, autoscale_timer) have exited, and
# kopf re-checks a timer that was mid-run (a reconcile, a round) every cancellation_polling seconds,
# 60 by default, with nothing else waking the check: such a fleet stayed a minute after its cleanup.
TIMER_EXIT_POLL_S = 2.0
REDIS_TIMEOUT_S = 2.0
DRAIN_SECONDS = float(os.environ.get("PREFIXFLEET_DRAIN_SECONDS", "15"))


@dataclass
class OperatorContext:
    """What the handlers share (kept in kopf's ``memo``, not in module globals)."""

    kube: Kube
    default_redis_url: str = field(default="", repr=False)  # may hold a password (below)
    # per fleet ("namespace/name"): its lock and how many hold or wait for it (fleet_lock); none
    # when nobody does, so a deleted fleet leaves nothing behind
    locks: dict[str, tuple[asyncio.Lock, int]] = field(default_factory=dict)
    queued: set[str] = field(default_factory=set)
    # one client per Redis URL (its credentials included: fleets share one only when they dial the
    # same URL with the same credentials), async for the event loop, sync for the worker threads.
    # These maps are keyed by that URL, password and all: none of them is in the repr (a log line or
    # a test's failure printing the context would show every fleet's password).
    redis_clients: dict[str, aioredis.Redis] = field(default_factory=dict, repr=False)
    sync_redis_clients: dict[str, redis.Redis] = field(default_factory=dict, repr=False)
    # per fleet ("namespace/name"): the URL it uses, recorded by its reconciles before any Redis call
    # of the round (none when the fleet is gone). A client's pool keeps connections between calls, so
    # the clients of a URL no fleet uses any more (new credentials or settings are another URL; a
    # deleted fleet) are closed rather than kept until the operator exits.
    redis_users: dict[str, str] = field(default_factory=dict, repr=False)
    # per URL: async calls in flight on its client (using_redis; the event loop's only). Another
    # fleet's autoscaler, or this fleet's own round begun before its credentials changed, may still be
    # mid-command on a URL no fleet records any more: its client is closed after their last call.
    redis_calls: dict[str, int] = field(default_factory=dict, repr=False)
    redis_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # the fleets ("namespace/name") whose Redis ACL user was last found denied DISCARD: the hint is
    # logged on the round that finds it, not on every round while it lasts (discard_hint)
    discard_denied: set[str] = field(default_factory=set)
    reconciles: int = 0
    last_reconcile: float = 0.0
    # prefixfleet_operator_unhealthy_replacements_total, in the operator's metrics registry (set by
    # autoscale_handlers when it serves that registry; absent, replacements are not counted)
    unhealthy_replacements: Counter | None = None
    # prefixfleet_operator_unavailable_replicas, likewise: set by every reconcile that planned
    unavailable_replicas: Gauge | None = None
    # per fleet: (monotonic due time, task) of the next reconcile planned ahead of the timer (a drain
    # in progress, or an unready replica's allowance running out); the task removes it when it ends
    rechecks: dict[str, tuple[float, asyncio.Task[None]]] = field(default_factory=dict)
    # the deletions ("namespace/name/uid") whose Deleted Event was posted: kopf runs fleet_deleted
    # again while a timer of the fleet is still exiting; fleet_gone forgets one once the fleet is gone
    deletions_said: set[str] = field(default_factory=set)
    # the children ("Kind/name") each deletion not yet said has removed, over its passes so far
    deletions_removed: dict[str, set[str]] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def using_redis(self, url: str) -> AsyncIterator[aioredis.Redis]:
        """The async client of ``url`` for the calls made inside: it is not closed while they run,
        and after them it is if no fleet uses ``url`` (any more)."""
        self.redis_calls[url] = self.redis_calls.get(url, 0) + 1
        try:
            if url not in self.redis_clients:
                self.redis_clients[url] = aioredis.from_url(
                    url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
                )
            yield self.redis_clients[url]
        finally:
            self.redis_calls[url] -= 1
            if not self.redis_calls[url]:
                del self.redis_calls[url]
            await self.close_unused_redis()

    def sync_redis(self, url: str) -> redis.Redis:
        """For the reconcile's worker thread (the async clients belong to the event loop)."""
        with self.redis_lock:  # reconciles of several fleets run in worker threads at once
            if url not in self.sync_redis_clients:
                self.sync_redis_clients[url] = redis.Redis.from_url(
                    url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
                )
            return self.sync_redis_clients[url]

    def dial_redis(self, fleet: str, url: str) -> None:
        """``fleet`` ("namespace/name") now uses ``url`` ("": none, or it is gone). The sync client of
        the URL it used before is closed once no fleet uses that one: only a fleet's reconcile, which
        records its URL first and runs one at a time per fleet, calls on it. The async client is
        closed by :meth:`close_unused_redis`, on the event loop, once no call is in flight on it."""
        with self.redis_lock:
            before = self.redis_users.pop(fleet, "")
            if url:
                self.redis_users[fleet] = url
            unused = before != url and before not in self.redis_users.values()
            client = self.sync_redis_clients.pop(before, None) if unused else None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    async def close_unused_redis(self) -> None:
        """Close the async clients of the URLs no fleet uses and no call is in flight on."""
        with self.redis_lock:
            used = set(self.redis_users.values())
        # all taken out before the first await: a call starting meanwhile gets a new client
        closing = [
            self.redis_clients.pop(url) for url in unused_urls(self.redis_clients, used, self.redis_calls)
        ]
        for client in closing:
            with contextlib.suppress(Exception):
                await client.aclose()


def unused_urls(clients: Iterable[str], used: Collection[str], in_flight: Mapping[str, int]) -> list[str]:
    """The URLs among ``clients`` whose client may be closed: no fleet uses it, no call is on it."""
    return [url for url in clients if url not in used and not in_flight.get(url)]


@dataclass(frozen=True)
class ReconcileOutcome:
    """What the threaded part did, for the async part (membership, events)."""

    fleet: dict[str, Any]
    events: tuple[PlannedEvent, ...] = ()
    spec: FleetSpec | None = None
    ref: FleetRef | None = None
    pods: tuple[ObservedPod, ...] = ()
    redis_url: str = ""
    draining: bool = False  # a drain is in progress: look again soon, not only at the next timer
    replaced: tuple[UnhealthyReplica, ...] = ()  # unhealthy replicas deleted by this reconcile
    recheck_after_s: float | None = None  # an unready replica's allowance runs out then
    unavailable: int | None = None  # replicas served, unready, nothing replaces; None: not planned
    # what the reconcile logs as a warning on the fleet, apart from its status (said once: see
    # OperatorContext.discard_denied)
    notices: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------
# Startup: settings that keep a stalled watch from freezing the operator.


@kopf.on.startup()
async def configure(
    settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger, **_: Any
) -> None:
    # The server ends each watch after server_timeout; a stream silent for longer than
    # client_timeout (a half-open connection) is dropped client-side; both just reconnect.
    settings.watching.server_timeout = float(os.environ.get("PREFIXFLEET_WATCH_SERVER_TIMEOUT", "60"))
    settings.watching.client_timeout = settings.watching.server_timeout + 30
    settings.watching.connect_timeout = 10
    settings.watching.inactivity_timeout = settings.watching.client_timeout + 10
    # Only our own pods and router Deployments are streamed, filtered by the API server: in a big
    # cluster, watching every pod would cost the operator (and the API server) far more.
    settings.watching.label_selectors["v1", "pods"] = f"{LABEL_MANAGED_BY}={MANAGER}"
    settings.watching.label_selectors["apps", "deployments"] = f"{LABEL_MANAGED_BY}={MANAGER}"
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10
    settings.posting.level = logging.INFO
    settings.posting.reporting_component = MANAGER
    settings.persistence.finalizer = FINALIZER
    settings.background.cancellation_polling = TIMER_EXIT_POLL_S
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="prefixfleet.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="prefixfleet.io", key="last-handled-configuration"
    )
    default_redis = getattr(memo, "default_redis_url", "") or os.environ.get("PREFIXFLEET_REDIS_URL", "")
    memo.ctx = OperatorContext(
        kube=Kube(await asyncio.to_thread(load_api_client)), default_redis_url=default_redis
    )
    logger.info("prefixfleet operator configured (default Redis: %s)", redacted(default_redis) or "none")


@kopf.on.cleanup()
async def close_clients(memo: kopf.Memo, **_: Any) -> None:
    ctx: OperatorContext | None = getattr(memo, "ctx", None)
    if ctx is None:
        return
    for _, task in ctx.rechecks.values():
        task.cancel()
    # snapshots: a call ending while a client closes (using_redis) takes its URL's client out of
    # the map, as a worker thread's dial_redis does for the sync ones
    for client in list(ctx.redis_clients.values()):
        with contextlib.suppress(Exception):
            await client.aclose()
    with ctx.redis_lock:
        sync_clients = list(ctx.sync_redis_clients.values())
    for sync_client in sync_clients:
        with contextlib.suppress(Exception):
            sync_client.close()


@kopf.on.probe(id="reconciles")
def reconcile_count(memo: kopf.Memo, **_: Any) -> int:
    ctx: OperatorContext | None = getattr(memo, "ctx", None)
    return ctx.reconciles if ctx else 0


# ---------------------------------------------------------------------------------------------
# Triggers.


@kopf.on.resume(**FLEET_RESOURCE)
@kopf.on.create(**FLEET_RESOURCE)
@kopf.on.update(**FLEET_RESOURCE)
async def fleet_changed(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    await reconcile(memo.ctx, body.metadata.namespace or "default", body.metadata.name or "", logger)


@kopf.timer(**FLEET_RESOURCE, interval=RECONCILE_INTERVAL_S, sharp=False)
async def fleet_timer(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    await reconcile(memo.ctx, body.metadata.namespace or "default", body.metadata.name or "", logger)


@kopf.on.event("v1", "pods", labels={LABEL_ROLE: "replica", LABEL_MANAGED_BY: MANAGER})
async def replica_pod_event(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    fleet = (body.metadata.labels or {}).get("prefixfleet.io/fleet")
    if fleet and getattr(memo, "ctx", None) is not None:
        await reconcile(memo.ctx, body.metadata.namespace or "default", fleet, logger)


@kopf.on.event("apps", "v1", "deployments", labels={LABEL_ROLE: "router", LABEL_MANAGED_BY: MANAGER})
async def router_event(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    # the router's readiness is part of the fleet's Ready condition
    fleet = (body.metadata.labels or {}).get("prefixfleet.io/fleet")
    if fleet and getattr(memo, "ctx", None) is not None:
        await reconcile(memo.ctx, body.metadata.namespace or "default", fleet, logger)


@kopf.on.delete(**FLEET_RESOURCE)
async def fleet_deleted(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    ctx: OperatorContext = memo.ctx
    namespace, name = body.metadata.namespace or "default", body.metadata.name or ""
    ref = FleetRef(name=name, namespace=namespace, uid=body.metadata.uid or "")
    if (pending := ctx.rechecks.pop(f"{namespace}/{name}", None)) is not None:
        pending[1].cancel()
    said = f"{namespace}/{name}/{ref.uid}"
    async with fleet_lock(ctx, f"{namespace}/{name}"):
        # what every pass of this deletion removed: one that failed midway (kopf runs it again,
        # a minute later) counts in the Event too, and a child deleted again in a later pass (a pod
        # still terminating) once
        removed = ctx.deletions_removed.setdefault(said, set())
        await asyncio.to_thread(delete_children, ctx.kube, ref, removed)
        redis_url = await asyncio.to_thread(resolve_redis_url, ctx, namespace, dict(body.get("spec", {})))
        if redis_url:
            try:
                async with ctx.using_redis(redis_url) as client:
                    await client.delete(FleetKeys(ref.redis_fleet).members)
            except RedisError as exc:
                logger.warning(
                    "could not clear the membership of %s in Redis: %s",
                    ref.redis_fleet,
                    redis_error_text(exc),
                )
        forget_fleet_series(ctx, namespace, name)  # autoscaled or not (OperatorMetrics.forget is not)
        ctx.dial_redis(f"{namespace}/{name}", "")
        await ctx.close_unused_redis()  # its URL's clients, unless another fleet uses it or a call is on
    # Once per deletion, children or none (a fleet refused from the start, or whose children a
    # foreground cascade removed first, is deleted too): kopf runs this handler again every
    # TIMER_EXIT_POLL_S while a timer of the fleet is still exiting, and each such pass finds
    # nothing left ("removed 0 children" once per pass would flood the fleet's Events). By uid: a
    # fleet created again under the name is another deletion.
    if said not in ctx.deletions_said:
        kopf.info(body, reason="Deleted", message=f"removed {len(removed)} children")
        ctx.deletions_said.add(said)
    ctx.deletions_removed.pop(said, None)


def _gone(type: str | None, **_: Any) -> bool:  # kopf names the watch event's type so
    return type == "DELETED"


@kopf.on.event(**FLEET_RESOURCE, when=_gone)
def fleet_gone(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The fleet is gone (its finalizer removed): no pass of its deletion follows."""
    ctx: OperatorContext | None = getattr(memo, "ctx", None)
    if ctx is not None:
        meta = body.metadata
        said = f"{meta.namespace or 'default'}/{meta.name or ''}/{meta.uid or ''}"
        ctx.deletions_said.discard(said)
        ctx.deletions_removed.pop(said, None)


def forget_fleet_series(ctx: OperatorContext, namespace: str, name: str) -> None:
    """Drop the series the reconcile keeps of a fleet that is gone: unavailable_replicas, and
    unhealthy_replacements_total (a deleted fleet's count would stay for the operator's life, and a
    fleet created again under the name would go on with it)."""
    if ctx.unavailable_replicas is not None:
        with contextlib.suppress(KeyError):
            ctx.unavailable_replicas.remove(namespace, name)
    if ctx.unhealthy_replacements is not None:
        for reason in get_args(UnhealthyReason):
            with contextlib.suppress(KeyError):
                ctx.unhealthy_replacements.remove(namespace, name, reason)


# ---------------------------------------------------------------------------------------------
# The reconcile.


@contextlib.asynccontextmanager
async def fleet_lock(ctx: OperatorContext, key: str) -> AsyncIterator[None]:
    """Hold fleet ``key``'s lock: its reconciles and its deletion run one at a time. The lock exists
    while someone holds or waits for it (counted on the event loop, no await in between), so the
    operator keeps none for fleets long deleted (a fresh lock is as good as an idle one)."""
    lock, users = ctx.locks.get(key) or (asyncio.Lock(), 0)
    ctx.locks[key] = (lock, users + 1)
    try:
        async with lock:
            yield
    finally:
        lock, users = ctx.locks[key]
        if users > 1:
            ctx.locks[key] = (lock, users - 1)
        else:
            del ctx.locks[key]


async def reconcile(ctx: OperatorContext, namespace: str, name: str, logger: logging.Logger) -> None:
    key = f"{namespace}/{name}"
    if key in ctx.queued:
        return  # one is already waiting for the lock: it will see this change too
    ctx.queued.add(key)
    async with contextlib.AsyncExitStack() as held:
        try:
            await held.enter_async_context(fleet_lock(ctx, key))
        finally:
            # its turn came, or it was cancelled waiting (a recheck cancelled): no longer waiting,
            # else every later reconcile of the fleet would return as if one still were
            ctx.queued.discard(key)
        outcome = await asyncio.to_thread(reconcile_in_cluster, ctx, namespace, name)
        # the round recorded the fleet's URL: the async client of the one it used before goes now if
        # nothing else uses it (its sync client went in the round)
        await ctx.close_unused_redis()
        ctx.reconciles += 1
        ctx.last_reconcile = time.time()
        if outcome is None:  # the fleet is gone or going
            forget_fleet_series(ctx, namespace, name)
            return
        if outcome.unavailable is not None and ctx.unavailable_replicas is not None:
            ctx.unavailable_replicas.labels(namespace, name).set(outcome.unavailable)
        if outcome.spec is not None and outcome.ref is not None and outcome.redis_url:
            await publish_membership(ctx, outcome, logger)
        for event in outcome.events:
            kopf.event(outcome.fleet, type=event.type, reason=event.reason, message=event.message)
        for notice in outcome.notices:
            logger.warning("%s", notice)
        for unhealthy in outcome.replaced:
            logger.warning("replacing an unhealthy replica: %s", unhealthy.message)
            if ctx.unhealthy_replacements is not None:
                ctx.unhealthy_replacements.labels(namespace, name, unhealthy.reason).inc()
        if outcome.draining:  # look again soon, not only at the next timer
            schedule_recheck(ctx, namespace, name, logger, MIN_DRAIN_S)
        if outcome.recheck_after_s is not None:
            schedule_recheck(ctx, namespace, name, logger, outcome.recheck_after_s)


def schedule_recheck(
    ctx: OperatorContext, namespace: str, name: str, logger: logging.Logger, delay: float
) -> None:
    """Reconcile after ``delay`` seconds: when an unready replica's allowance runs out (a hung replica
    changes nothing that would trigger one) or a drain may be over; one pending per fleet, moved
    earlier when needed."""
    key, now = f"{namespace}/{name}", time.monotonic()
    due = now + delay + 0.5  # past the deadline: the API's times have whole seconds
    pending = ctx.rechecks.get(key)
    # (the pending one may be the task running this very reconcile: it is no longer pending)
    if pending is not None and not pending[1].done() and pending[1] is not asyncio.current_task():
        if pending[0] <= due:
            return
        pending[1].cancel()  # moved earlier: the later one would only reconcile once more for nothing
    ctx.rechecks[key] = (due, asyncio.create_task(reconcile_later(ctx, namespace, name, logger, due - now)))


async def reconcile_later(
    ctx: OperatorContext, namespace: str, name: str, logger: logging.Logger, delay: float
) -> None:
    try:
        await asyncio.sleep(delay)
        await reconcile(ctx, namespace, name, logger)
    except Exception as exc:  # the timer retries; a follow-up must not die noisily
        logger.warning("follow-up reconcile of %s/%s failed: %s", namespace, name, exc)
    finally:
        # no longer pending (unless its reconcile planned the next one, which replaced the entry):
        # a done task kept here would stay until the fleet is deleted, or for ever if it already was
        key = f"{namespace}/{name}"
        if (pending := ctx.rechecks.get(key)) is not None and pending[1] is asyncio.current_task():
            del ctx.rechecks[key]


def resolve_redis_url(ctx: OperatorContext, namespace: str, spec: dict[str, Any]) -> str:
    """The URL the operator itself uses for a fleet's Redis (``FleetRedis.dial_url``)."""
    return fleet_redis(ctx, namespace, spec.get("redis") or {}).dial_url


@dataclass(frozen=True, slots=True)
class FleetRedis:
    """A fleet's Redis URL before ``passwordSecretRef`` is applied ("" if none) and, when the
    Secrets the spec names cannot give a usable one, why, naming the field (never the URL: it may
    hold a password). A ``spec.redis.url`` or operator default may itself carry a password, which
    then reaches the pods' env as written (Warning RedisPasswordInSpec); a secretRef's URL does
    not: the pods read it from the Secret."""

    url: str
    problem: str = ""
    # What the operator itself dials: ``url`` with ``passwordSecretRef`` and ``tls`` applied (the
    # pods get the same settings through their env, see the planner); "" when there is none or it
    # cannot be used. In memory only: never in a manifest, a message or a repr.
    dial_url: str = field(default="", repr=False)


def fleet_redis(ctx: OperatorContext, namespace: str, redis: dict[str, Any]) -> FleetRedis:
    """The Redis of a fleet's ``spec.redis``: its url, the URL in its secretRef's Secret (checked
    with the sidecar's rule: the CRD cannot see it), or the operator's default."""
    problem = ""
    if redis.get("url"):
        url = str(redis["url"])
    elif ref := redis.get("secretRef"):
        value, problem = _secret_value(ctx, namespace, "spec.redis.secretRef", ref)
        if value is not None and (error := redis_url_error(value)) is not None:
            problem = (
                f"spec.redis.secretRef: the URL in Secret {ref.get('name')!r} key {ref.get('key')!r} cannot"
                f" be used (the sidecar would exit at start): {error}"
            )
        url = "" if problem else str(value)
    else:
        url = ctx.default_redis_url
    password = None
    if (password_ref := redis.get("passwordSecretRef")) and not problem:
        password, problem = _secret_value(ctx, namespace, "spec.redis.passwordSecretRef", password_ref)
    if problem or not url:
        return FleetRedis(url, problem)
    return FleetRedis(url, dial_url=with_credentials(url, password, tls=bool(redis.get("tls"))))


def _secret_value(
    ctx: OperatorContext, namespace: str, field_name: str, ref: dict[str, Any]
) -> tuple[str | None, str]:
    """(the value, "") or (None, why not, naming ``field_name`` and the Secret)."""
    name, key = str(ref.get("name", "")), str(ref.get("key", ""))
    try:
        value = ctx.kube.read_secret_key(namespace, name, key)
    except UnicodeDecodeError:
        return None, f"{field_name}: key {key!r} of Secret {name!r} is not UTF-8 text"
    except ApiException as exc:
        if exc.status != 403:
            raise
        return None, (
            f"{field_name}: the operator may not read Secret {name!r} in namespace {namespace!r}"
            " (chart value rbac.readSecrets)"
        )
    if value is None:
        return (
            None,
            f"{field_name}: Secret {name!r} in namespace {namespace!r} is missing or has no key {key!r}",
        )
    return value, ""


def redis_login_check(
    ctx: OperatorContext, redis: Mapping[str, Any], chosen: FleetRedis
) -> tuple[str | None, str]:
    """(the login's verdict, why Redis refused the login's PING for a reason about neither the
    credentials nor the ACL, "" when it did not).

    The verdict: why the fleet's Redis refuses the credentials the operator (and so every sidecar and
    gateway of the fleet) dials it with, naming what to fix; "" when it accepts them; None when it
    does not answer at all (refused, reset, timed out: an outage, which stays a logged warning and a
    retry on the next round, and nothing more is asked of it this round: a host dropping packets
    costs one timeout, not one per question), or when it refuses the PING for LOADING, BUSY or
    MISCONF (which decides nothing about the credentials; the second item says what Redis answered).
    One AUTH (with the credentials; none without) and PING per reconcile, one round trip, on the
    URL's kept connection: the credentials are proven every round, so a password rotated on the
    server is said the same round (a PING alone is answered on a connection logged in before),
    whichever pooled connection it lands on."""
    try:
        login(ctx.sync_redis(chosen.dial_url))
    except NoPasswordSet:
        return None, no_password_problem(redis, chosen)
    except RedisRefused as exc:
        return None, str(exc)
    except (RedisError, OSError) as exc:
        # The client stays open: its idle connections were dropped (login), and another fleet
        # dialling this URL (so with the same credentials) may be mid-call on another of its
        # connections, which closing the client would cut. It is closed once no fleet uses the URL
        # (a fixed password is another URL: dial_redis).
        return auth_refusal(redis, chosen, exc) or None, ""
    return "", ""


def probe_verdicts(chosen: FleetRedis, answer: ProbeAnswer | None) -> tuple[str | None, str]:
    """What the permission probe's ``answer`` (:func:`redis_probe`) says: (which commands the fleet
    runs (operator, sidecars, gateways) its Redis denies the ACL user it accepted, naming them and the
    user (never the password), "" when none; which commands Redis refused for a reason other than the
    ACL, with its errors (a read-only replica, out of memory, a proxy without MULTI), "" when none).
    (None, "") when Redis did not answer: an outage, the round keeps the fleet's last verdict
    (planner.redis_verdict)."""
    if answer is None:
        return None, ""
    return permission_problem(acl_user(chosen.dial_url), answer.denied), refusal_problem(answer.refused)


def redis_probe(ctx: OperatorContext, chosen: FleetRedis, ref: FleetRef) -> ProbeAnswer | None:
    """What the fleet's Redis answered the permission probe, one queued-and-aborted transaction per
    reconcile (nothing is written); None when it did not answer."""
    # the keys of its first replica: the same every round (one message, one Event), and matched by
    # per-fleet or per-replica key patterns alike
    commands = fleet_commands(FleetKeys(ref.redis_fleet), replica_name(ref, 0))
    try:
        return probe_commands(ctx.sync_redis(chosen.dial_url), commands)
    except (RedisError, OSError):
        return None


def discard_notice(
    ctx: OperatorContext, fleet: str, answer: ProbeAnswer | None, user: str
) -> tuple[str, ...]:
    """The DISCARD hint (redis_permissions.discard_hint) for the round of ``fleet`` that finds it
    denied, none on the rounds after while it stays so; a round without an answer changes nothing."""
    if answer is None:
        return ()
    if not answer.discard_denied:
        ctx.discard_denied.discard(fleet)
        return ()
    if fleet in ctx.discard_denied:
        return ()
    ctx.discard_denied.add(fleet)
    return (discard_hint(user),)


def credentials_where(redis: Mapping[str, Any]) -> tuple[str, str]:
    """(where the fleet's Redis URL comes from, where its passwordSecretRef's password does, "" when
    it has none), naming the field and Secret (``redis`` is the spec's ``redis``), for a message."""
    url_ref, password_ref = redis.get("secretRef") or {}, redis.get("passwordSecretRef") or {}
    if redis.get("url"):
        url_where = "spec.redis.url: the URL"
    elif url_ref:
        url_where = (
            f"spec.redis.secretRef: the URL in Secret {url_ref.get('name')!r} key {url_ref.get('key')!r}"
        )
    else:
        url_where = "the operator's default Redis (--redis, PREFIXFLEET_REDIS_URL): its URL"
    password_where = (
        f"spec.redis.passwordSecretRef: the password in Secret {password_ref.get('name')!r}"
        f" key {password_ref.get('key')!r}"
        if password_ref
        else ""
    )
    return url_where, password_where


def password_source(redis: Mapping[str, Any], chosen: FleetRedis) -> tuple[str, str] | None:
    """(where the password the fleet dials its Redis with comes from, naming the field and Secret
    (:func:`credentials_where`), what Redis gets from there: "its user and password" for the URL's,
    which wins over passwordSecretRef (with_credentials), "it" for passwordSecretRef's); None when the
    fleet sets no password."""
    url_where, password_where = credentials_where(redis)
    if urlsplit(chosen.url).password:
        return url_where, "its user and password"
    if password_where:
        return password_where, "it"
    return None


def no_password_problem(redis: Mapping[str, Any], chosen: FleetRedis) -> str:
    """Why a Redis without a password refusing the fleet's (NoPasswordSet) must be fixed, naming the
    field that holds it (never the password)."""
    where, _ = password_source(redis, chosen) or ("", "")  # NoPasswordSet: the fleet sent one
    return (
        f"{where}: the fleet gives its Redis a password, but that Redis has none set: it refuses the AUTH"
        " a client logs in with (redis-py 8's HELLO still connects: a default user without a password"
        " takes any), and the password protects nothing. Set it on Redis (CONFIG SET requirepass, or"
        " ACL SETUSER default on >PASSWORD) or take the password out of the fleet"
    )


def auth_refusal(redis: Mapping[str, Any], chosen: FleetRedis, exc: BaseException) -> str:
    """What ``exc`` says about the fleet's Redis credentials (``redis`` is the spec's ``redis``), or
    "" when it is not about them. Never the server's text, the URL or the password: only which field
    and Secret hold the credentials Redis refused."""
    auth_error = isinstance(exc, AuthenticationError) or (
        isinstance(exc, ResponseError) and str(exc).startswith(AUTH_REFUSALS)
    )
    if not isinstance(exc, (AuthenticationWrongNumberOfArgsError, NoPermissionError)) and not auth_error:
        return ""
    if isinstance(exc, AuthenticationWrongNumberOfArgsError):
        return (
            f"{credentials_where(redis)[0]} names a user, but the fleet's Redis takes none (older than"
            " Redis 6): drop the user from the URL"
        )
    if (source := password_source(redis, chosen)) is None:
        return (
            "spec.redis.passwordSecretRef: the fleet's Redis requires a password and the fleet sets none"
            " (name the Secret holding it here)"
        )
    where, what = source
    if isinstance(exc, NoPermissionError):
        return f"{where}: the fleet's Redis accepted {what}, but the ACL user may not run PING"
    # not the user name either: a URL like redis://secret@host puts the password there
    return f"{where}: the fleet's Redis refused {what} (a wrong password, or an unknown or disabled user)"


def reconcile_in_cluster(ctx: OperatorContext, namespace: str, name: str) -> ReconcileOutcome | None:
    """Observe, plan, execute (runs in a worker thread; every call is idempotent)."""
    kube = ctx.kube
    fleet = kube.get("PrefixCacheFleet", namespace, name)
    if fleet is None or fleet["metadata"].get("deletionTimestamp"):
        ctx.dial_redis(f"{namespace}/{name}", "")
        ctx.discard_denied.discard(f"{namespace}/{name}")
        return None
    meta = fleet["metadata"]
    ref = FleetRef(
        name=name, namespace=namespace, uid=meta.get("uid", ""), generation=meta.get("generation", 1)
    )
    current_status = fleet.get("status") or {}
    conditions = current_status.get("conditions") or []
    pods = tuple(observe_pod(p) for p in kube.list("Pod", namespace, replica_selector(ref)))
    try:
        spec = validate_spec(fleet.get("spec") or {})
    except InvalidFleetSpec as exc:
        # nothing dials its Redis until the spec is valid again: the URL of its last valid round is
        # no longer recorded, so its clients close unless another fleet uses it
        ctx.dial_redis(f"{namespace}/{name}", "")
        # no plan, so no replacement either: the unavailable gauge still follows the pods, not the
        # last valid spec's reconcile
        unavailable = len(unavailable_while_invalid(pods))
        status = plan_invalid_spec(ref, exc.problems, ObservedState(conditions=conditions))
        changes = status_changes(current_status, status)
        if not changes:
            return ReconcileOutcome(fleet, unavailable=unavailable)
        kube.patch_status("PrefixCacheFleet", namespace, name, changes)
        return ReconcileOutcome(
            fleet, (PlannedEvent("Warning", "InvalidSpec", str(exc)),), unavailable=unavailable
        )

    children: dict[str, str] = {}
    live_children: dict[str, Any] = {}  # by "Kind/name": their last-applied record guides updates
    child_labels: dict[str, ObservedLabels] = {}
    router_ready = 0
    for kind in ("ConfigMap", "Deployment", "Service"):
        child = kube.get(kind, namespace, router_name(ref))
        if child is not None:
            live_children[f"{kind}/{router_name(ref)}"] = child
            child_labels[f"{kind}/{router_name(ref)}"] = observe_labels(child)
            children[f"{kind}/{router_name(ref)}"] = (child["metadata"].get("annotations") or {}).get(
                ANNOTATION_SPEC_HASH, ""
            )
            if kind == "Deployment":
                router_ready = int((child.get("status") or {}).get("readyReplicas") or 0)
    redis_spec = (fleet.get("spec") or {}).get("redis") or {}
    chosen_redis = fleet_redis(ctx, namespace, redis_spec)
    ctx.dial_redis(f"{namespace}/{name}", chosen_redis.dial_url)
    # an unusable Redis is not dialled (dial_url ""): the fleet says why (Degraded=RedisUnusable)
    redis_url = chosen_redis.dial_url
    # one that refuses the credentials is said on the fleet (Degraded=RedisAuthFailed), not dialled
    # again this round (membership, drains): no warning per call. Not dialled: None (not asked, the
    # last verdict stands) when its URL or password cannot be read this round (RedisUnusable says
    # why), "" when the fleet has no Redis at all (nothing to refuse)
    not_asked = None if chosen_redis.problem else ""
    login, redis_refused = redis_login_check(ctx, redis_spec, chosen_redis) if redis_url else (not_asked, "")
    # one that takes them (login "") but denies the user a command the fleet runs is said too
    # (Degraded=RedisPermissionDenied); the round still dials it for what it may do. Commands refused
    # for another reason (a read-only replica, LOADING, MISCONF) are said apart (RedisCommandsRefused)
    permissions: str | None = ""
    notices: tuple[str, ...] = ()
    if redis_url and login == "":
        answer = redis_probe(ctx, chosen_redis, ref)
        permissions, redis_refused = probe_verdicts(chosen_redis, answer)
        notices = discard_notice(ctx, f"{namespace}/{name}", answer, acl_user(chosen_redis.dial_url))
    # one that did not answer (None) leaves the fleet's last verdict as it is: no clearing during an
    # outage, no second Warning Event when it answers the same again
    auth_problem, permission_problem = redis_verdict(login, permissions, conditions)
    # nor about the commands refused for another reason: Redis answered them only when it named a
    # refusal (a refused PING says one) or the permission check got its answer. A login it refused
    # clears that verdict: what the fleet's calls get now is the refusal of its credentials
    answered = bool(redis_refused) or (login == "" and permissions is not None) or bool(login)
    redis_refused = refused_verdict(redis_refused if answered else None, conditions)
    if auth_problem:
        redis_url = ""
    if redis_url and any(p.draining for p in pods):
        pods = with_in_flight(ctx, redis_url, ref, pods)
    victims = [v for v in (meta.get("annotations") or {}).get(ANNOTATION_VICTIMS, "").split(",") if v]
    observed = ObservedState(
        pods=pods,
        children=children,
        child_labels=child_labels,
        fleet_labels=meta.get("labels") or {},
        router_ready_replicas=router_ready,
        conditions=conditions,
        victims=victims,
        # the default URL for the planner's pod env: it holds any password written in it (a
        # secretRef's URL is never written out: the env refers to the Secret)
        redis_url=chosen_redis.url,
        redis_problem=chosen_redis.problem,
        redis_auth_problem=auth_problem,
        redis_permission_problem=permission_problem,
        redis_refused=redis_refused,
        redis_password_warning=redis_password_warning(redis_spec, ctx.default_redis_url),
        project_image=os.environ.get("PREFIXFLEET_IMAGE", ""),
        drain_seconds=DRAIN_SECONDS,
    )
    plan = plan_reconcile(ref, spec, observed)

    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for pod_name in plan.drain_pods:
        kube.annotate(
            "Pod", namespace, pod_name, {ANNOTATION_STATE: "draining", ANNOTATION_DRAINING_SINCE: stamp}
        )
    for pod_name in plan.undrain_pods:
        kube.annotate("Pod", namespace, pod_name, {ANNOTATION_STATE: None, ANNOTATION_DRAINING_SINCE: None})
    for pod_name in plan.mark_ready:
        kube.annotate("Pod", namespace, pod_name, {ANNOTATION_FIRST_READY: stamp})
    for pod_name, mark in plan.mark_unready:
        kube.annotate("Pod", namespace, pod_name, {ANNOTATION_UNREADY_SEEN: mark})
    # A child the API server refuses (an invalid podTemplate, a policy, a quota) does not stop the
    # others, the router or the status: the fleet says which and why (operator/refusals.py).
    refused: list[str] = []
    refused_relabels: list[str] = []
    written: set[str] = set()  # the pods relabelled and router children written (the Events say them)
    for pod_name, patch in plan.relabel_pods:  # in place: the pod keeps running
        try:
            relabel_pod(kube, namespace, pod_name, patch)
            written.add(pod_name)
        except ChildRefused as exc:
            # an admission policy on pod labels (a required label the fleet dropped): the pods share
            # the patch, so as for creates, the round's relabels end at the first refusal (the second
            # when a webhook, which may judge pods one by one, refused the first)
            if not go_on_after(exc, refused, refused_relabels):
                break
    for deletion in plan.delete_pods:
        kube.delete("Pod", namespace, deletion.name)
    refused_creates: list[str] = []
    # (the planner's manifests carry their owner reference and the fleet's labels: kopf.adopt, which
    # added labels behind the planner's back, is not used)
    for manifest in plan.create_pods:
        try:
            kube.create(manifest)
        except ChildRefused as exc:
            # the others share its template and namespace: a quota or an invalid podTemplate refuses
            # them too. One refused call per round, not one per missing replica (two when a webhook,
            # which may judge pods one by one, refused the first); the next round tries again from
            # the first missing one.
            if not go_on_after(exc, refused, refused_creates):
                break
    for change in plan.children:
        try:
            # created with the record of what it holds, so a later update removes what is dropped
            if change.action == "create" and kube.create(with_last_applied(change.manifest)):
                written.add(change.key)
                continue
            # None (created meanwhile by another round, or by an operator that kept no record):
            # nothing is removed this once, and the record is written
            kube.replace_spec(change.manifest, live_children.get(change.key))
            written.add(change.key)
        except ChildRefused as exc:
            refused.append(str(exc))
    changes = status_changes(current_status, with_refusals(plan.status, refused, conditions))
    if changes:
        kube.patch_status("PrefixCacheFleet", namespace, name, changes)
    draining = bool(plan.drain_pods) or any(p.draining and p.alive for p in pods)
    events = (*events_carried_out(plan, written, bool(refused)), *refusal_events(refused, conditions))
    return ReconcileOutcome(
        fleet,
        events,
        spec,
        ref,
        pods,
        redis_url,
        draining,
        plan.replaced,
        plan.recheck_after_s,
        len(plan.unavailable),
        notices,
    )


def go_on_after(exc: ChildRefused, refused: list[str], of_its_kind: list[str]) -> bool:
    """Note a refused replica pod write in ``refused`` (the round's refusals, the fleet shows them)
    and ``of_its_kind`` (the round's refused creates, or relabels); whether to try the next one of
    its kind this round (refusals.try_next_create)."""
    refused.append(str(exc))
    of_its_kind.append(exc.api_message)
    return try_next_create(of_its_kind)


def relabel_pod(kube: Kube, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
    """A replica pod's label merge patch (ReconcilePlan.relabel_pods); one the API server refuses
    (400, 403, 422: an admission policy on pod labels) is ChildRefused, like a refused create."""
    try:
        kube.merge_patch("Pod", namespace, name, dict(patch))
    except ApiException as exc:
        if exc.status in REFUSAL_STATUSES:
            raise ChildRefused("Pod", namespace, name, exc) from None
        raise


def with_in_flight(
    ctx: OperatorContext, redis_url: str, ref: FleetRef, pods: tuple[ObservedPod, ...]
) -> tuple[ObservedPod, ...]:
    """Draining pods with their sidecars' in-flight counts (load records); unknown stays None."""
    keys = FleetKeys(ref.redis_fleet)
    out = []
    for pod in pods:
        if pod.draining:
            try:
                raw = ctx.sync_redis(redis_url).get(keys.load(pod.name))
                if raw is not None:
                    pod = replace(pod, in_flight=decode_load(raw).in_flight)
            except (RedisError, OSError, SummaryError):
                pass  # unknown: the drain then lasts its full time
        out.append(pod)
    return tuple(out)


async def publish_membership(ctx: OperatorContext, outcome: ReconcileOutcome, logger: logging.Logger) -> None:
    assert outcome.spec is not None and outcome.ref is not None
    keys = FleetKeys(outcome.ref.redis_fleet)
    desired = desired_members(outcome.spec, outcome.pods, time.time())
    try:
        async with ctx.using_redis(outcome.redis_url) as client:
            await write_membership(client, keys, desired, logger)
    except (RedisError, OSError) as exc:
        logger.warning(
            "membership of %s not published (Redis: %s); retrying on the next reconcile",
            keys.fleet,
            redis_error_text(exc),
        )


async def write_membership(
    client: aioredis.Redis, keys: FleetKeys, desired: Mapping[str, MemberRecord], logger: logging.Logger
) -> None:
    current = await client.hgetall(keys.members)
    # Fields that name no worker (e.g. not UTF-8) are removed as stale: key.decode() raised on
    # them, so membership was never published.
    named, invalid = split_member_fields(current)
    junk = [key for key, _ in invalid]
    for _, name in invalid:
        logger.warning("removing member %r from %s: not a valid worker id", name, keys.members)
    plan = plan_membership(desired, named)
    if plan.is_noop and not junk:
        return
    async with client.pipeline(transaction=True) as pipe:
        if plan.set:
            pipe.hset(keys.members, mapping=dict(plan.set))
        if plan.delete or junk:
            pipe.hdel(keys.members, *plan.delete, *junk)
        for wid in plan.set:
            pipe.publish(keys.events, f"joined {wid}")
        for wid in plan.delete:
            pipe.publish(keys.events, f"left {wid}")
        await pipe.execute()


def delete_children(kube: Kube, ref: FleetRef, removed: set[str]) -> None:
    """Delete every child explicitly (owner references would let the garbage collector do it in a
    real cluster; doing it here also works where there is none, and is idempotent). Each child the
    API server deleted goes into ``removed`` ("Kind/name") as it goes, so a pass that raises midway
    keeps what it did."""
    for pod in kube.list("Pod", ref.namespace, replica_selector(ref)):
        if kube.delete("Pod", ref.namespace, name := pod["metadata"]["name"]):
            removed.add(f"Pod/{name}")
    for kind in ("Deployment", "Service", "ConfigMap"):
        if kube.delete(kind, ref.namespace, router_name(ref)):
            removed.add(f"{kind}/{router_name(ref)}")
