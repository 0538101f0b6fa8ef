"""A gateway's view of the fleet: members, their summaries and load, plus its own recent sends.

Pure state and decisions (no I/O): the gateway's refresh task feeds it raw Redis values
(:meth:`FleetView.apply_snapshot`), request handling asks it for :class:`ReplicaState` rows
(:meth:`FleetView.replica_states`). Liveness is judged on the gateway's own monotonic clock by
whether a worker's load ``seq`` keeps advancing, and only while Redis answers: when Redis is down
the view freezes on what it last knew instead of declaring everyone dead.

Matched tokens per worker = leading blocks of the request's hash chain found in the worker's summary
UNION this gateway's *overlay* (hashes it sent there recently), so a burst on a new prefix sticks to
one worker before that worker's next summary shows the prefix.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .blockhash import (
    DEFAULT_BLOCK_TOKENS,
    CacheIdentity,
    adapter_seeds,
    block_hashes,
    requested_adapter,
    salted_seed,
)
from .keys import DEFAULT_FLEET, FleetKeys
from .loadtrack import DEFAULT_PREFILL_TOKENS_PER_S
from .mirror import AdapterNamespace
from .policies import ReplicaState
from .records import LoadReport, MemberRecord, decode_engine, decode_load, decode_member, with_engine
from .served import workers_for_model
from .summary import Summary, SummaryError, decode_summary

DEFAULT_DEAD_AFTER_S = 3.0
DEFAULT_OVERLAY_TTL_S = 30.0
OVERLAY_SUMMARY_SLACK_S = 1.0  # a summary generated this long after a send surely includes it
SUSPECT_S = 2.0  # a worker that refused a connection sits out this long
MAX_RECENT_DONE = 256  # per worker: ended sends remembered to correct not-yet-updated reports
MAX_OVERLAY_PER_WORKER = 16384  # ~260k tokens of recent sends; summaries normally prune it first
MAX_OVERLAY_KEYS = 4  # cache names a worker's own sends were hashed under (normally 1; 2 just after a rename)
# A wait no honest report gives (a day): a foreign load record's figures (2**63 pending tokens at
# 1e-300 tokens/s) overflow to an infinite wait, which makes queue_aware's score NaN (0 x inf) and
# min() then picks that replica first; capped, the replica is just the last choice.
MAX_WAIT_S = 86400.0
_RESTRICTIVENESS = {"ready": 0, "warming": 1, "draining": 2}


@dataclass(slots=True)
class _Send:
    sent_at: float  # wall clock (compared with the sidecar's load report timestamps)
    uncached_tokens: int
    done_at: float = float("inf")  # wall clock when its answer ended


@dataclass(slots=True)
class WorkerView:
    worker_id: str
    url: str
    static: bool = False
    member: MemberRecord | None = None
    load: LoadReport | None = None
    load_changed_at: float = float("-inf")  # gateway monotonic time the load seq last advanced
    summary: Summary | None = None
    healthy: bool = True  # health checks (static workers) / engine_ok (sidecar workers)
    suspect_until: float = float("-inf")
    missing_since: float | None = None  # left the members hash at this time
    overlay: dict[int, float] = field(default_factory=dict)  # block hash -> wall time sent
    # The (identity seed, block size) pairs own sends were hashed under, newest last. A sidecar that
    # published its first summary before its engine named itself renames its cache once that name
    # arrives; its engine still holds what was sent under the placeholder, so those sends must still
    # match until a summary under the new name covers them (routing the next request elsewhere).
    overlay_keys: dict[tuple[int, int], None] = field(default_factory=dict)
    sends: dict[int, _Send] = field(default_factory=dict)  # own in-flight requests
    # own requests that ended recently: a load report written before they ended still counts them
    done: deque[_Send] = field(default_factory=lambda: deque(maxlen=MAX_RECENT_DONE))
    # blockhash.adapter_seeds of ``seeds_member`` (the member record they were built from): its LoRA
    # adapters' seeds, built once per record read rather than an identity per request
    seeds_member: MemberRecord | None = None
    seeds: dict[str, int] = field(default_factory=dict)
    # ends recorded before ``done`` is surely in done_at order again (0: it is): the wall clock
    # stepped back between two ends. In order, :func:`ended_since` reads only the newest entries.
    done_unordered: int = 0

    @property
    def state(self) -> str:
        """The most restrictive of the member record's state (operator) and the sidecar's own."""
        states = [r.state for r in (self.member, self.load) if r is not None]
        return max(states, key=_RESTRICTIVENESS.__getitem__, default="ready")

    def identity_seed(self, default_seed: int) -> int:
        if self.summary is not None:
            return self.summary.identity_seed
        if self.member is not None:
            return CacheIdentity(self.member.model, self.member.revision, self.member.adapter).seed()
        return default_seed

    def adapter_seeds(self, member: MemberRecord) -> dict[str, int]:
        """The seeds of the adapters ``member`` (this worker's record) lists, by name."""
        if self.seeds_member is not member:
            configured = CacheIdentity(member.model, member.revision, member.adapter)
            self.seeds, self.seeds_member = adapter_seeds(configured, member.adapters), member
        return self.seeds

    def block_tokens(self, default: int) -> int:
        if self.summary is not None:
            return self.summary.block_tokens
        if self.member is not None:
            return self.member.block_tokens
        return default

    @property
    def served_models(self) -> tuple[str, ...]:
        """The model names its sidecar says the engine answers to; () if unknown (a static worker, a
        sidecar that predates the field, an engine not asked yet)."""
        return self.member.served_models if self.member is not None else ()


@dataclass(frozen=True, slots=True)
class SnapshotResult:
    warnings: list[str]
    need_summaries: list[str]  # workers whose published summary version is newer than ours
    removed: list[str]  # workers that left the view (policies forget them)


class FleetView:
    def __init__(
        self,
        *,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        dead_after_s: float = DEFAULT_DEAD_AFTER_S,
        overlay_ttl_s: float = DEFAULT_OVERLAY_TTL_S,
        default_identity: CacheIdentity | None = None,
        default_prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S,
        fleet: str = DEFAULT_FLEET,
    ) -> None:
        self.block_tokens = block_tokens
        self.keys = FleetKeys(fleet)  # only to name the Redis key of a record it ignores
        self.dead_after_s = dead_after_s
        self.overlay_ttl_s = overlay_ttl_s
        self.default_seed = (default_identity or CacheIdentity()).seed()
        self.default_rate = default_prefill_tokens_per_s
        self.workers: dict[str, WorkerView] = {}
        self.last_refresh_ok: float = float("-inf")  # gateway monotonic
        self.reconnected_at: float = float("-inf")  # first successful read after an outage
        self.read_failed = False  # a Redis read failed since the last good one
        self._send_ids = itertools.count(1)

    # -- membership --------------------------------------------------------------------------------

    def add_static(self, url: str) -> WorkerView:
        url = url.rstrip("/")
        w = self.workers.get(url)
        if w is None:
            w = self.workers[url] = WorkerView(worker_id=url, url=url, static=True)
        return w

    def apply_snapshot(
        self,
        members: Mapping[str, bytes | str],
        loads: Mapping[str, bytes | str | None],
        now: float,
        engines: Mapping[str, bytes | str | None] | None = None,
    ) -> SnapshotResult:
        """Merge one read of the members hash and the members' load records (and their engine
        records: those of sidecars whose member record the operator writes, ``records.with_engine``)."""
        warnings: list[str] = []
        need: list[str] = []
        removed: list[str] = []
        gap = now - self.last_refresh_ok
        if self.read_failed and gap < float("inf"):
            # Redis was unreachable for ``gap``: heartbeats could not be seen, so that time does not
            # count towards anyone's death, and the fleet gets ``dead_after_s`` to re-register.
            self.reconnected_at = now
            for w in self.workers.values():
                w.load_changed_at += gap
        self.read_failed = False
        self.last_refresh_ok = now
        seen: set[str] = set()
        for wid, raw in members.items():
            try:
                member = decode_member(raw)
            except SummaryError as exc:
                warnings.append(f"ignoring member {wid!r} of {self.keys.members}: {exc}")
                continue
            raw_engine = engines.get(wid) if engines is not None else None
            if raw_engine is not None:
                try:
                    member = with_engine(member, decode_engine(raw_engine))
                except SummaryError as exc:  # routed as its member record says alone
                    warnings.append(f"ignoring engine record of {wid!r} ({self.keys.engine(wid)}): {exc}")
            seen.add(wid)
            w = self.workers.get(wid)
            if w is None or w.static:
                if w is not None and w.static:
                    continue  # a static URL used as an id: keep the static entry
                w = self.workers[wid] = WorkerView(worker_id=wid, url=member.url, load_changed_at=now)
            w.member, w.url, w.missing_since = member, member.url, None
            raw_load = loads.get(wid)
            if raw_load is None:
                continue
            try:
                load = decode_load(raw_load)
            except SummaryError as exc:
                warnings.append(f"ignoring load of {wid!r} ({self.keys.load(wid)}): {exc}")
                continue
            self._adopt_load(w, load, now)
            version = w.load.summary_version if w.load else 0
            if version and (w.summary is None or w.summary.version != version):
                need.append(wid)
        # Redis restarted empty (every member gone at once, or just back from an outage): keep the
        # view; sidecars re-register within their publish backoff.
        wiped = (not members or now - self.reconnected_at <= self.dead_after_s) and any(
            not w.static for w in self.workers.values()
        )
        for wid, w in list(self.workers.items()):
            if w.static or wid in seen:
                continue
            if w.missing_since is None:
                w.missing_since = now
            if not wiped or now - w.missing_since > self.dead_after_s:
                del self.workers[wid]
                removed.append(wid)
        return SnapshotResult(warnings, need, removed)

    @staticmethod
    def _adopt_load(w: WorkerView, load: LoadReport, now: float) -> None:
        current = w.load
        if current is not None and load.seq <= current.seq and load.ts <= current.ts:
            return  # not newer than what a push already delivered (or the same record again)
        summary = w.summary
        if current is not None and (
            load.seq < current.seq or (summary is not None and load.summary_version == 0)
        ):
            # A newer record with a lower seq, or one of a sidecar that has published no summary
            # while we hold one: a new sidecar under the same id (restarted, with its engine or
            # not). Its mirror starts empty, so the old summary, and what this gateway sent before
            # the old sidecar's last heartbeat, no longer describe the cache it will route on.
            w.summary = None
            for h in [h for h, sent_at in w.overlay.items() if sent_at <= current.ts]:
                del w.overlay[h]
        w.load_changed_at = now
        w.load = load
        w.healthy = load.engine_ok

    def apply_load(self, worker_id: str, load: LoadReport, now: float) -> None:
        """Adopt a load record pushed on the loads channel (``records.decode_load_push``)."""
        w = self.workers.get(worker_id)
        if w is None or w.static:
            return  # membership comes from the members hash; unknown workers wait for it
        self._adopt_load(w, load, now)

    def refresh_failed(self) -> None:
        """Record a failed Redis read (the next good snapshot then forgives the outage's time)."""
        self.read_failed = True

    def apply_summary(self, worker_id: str, raw: bytes | None) -> str | None:
        """Adopt a worker's summary; returns a warning when it is malformed (then it is ignored)."""
        w = self.workers.get(worker_id)
        if w is None or raw is None:
            return None
        try:
            summary = decode_summary(raw)
        except SummaryError as exc:
            return f"ignoring summary of {worker_id!r} ({self.keys.summary(worker_id)}): {exc}"
        if summary.worker != worker_id:
            key = self.keys.summary(worker_id)
            return f"ignoring summary under {worker_id!r} ({key}): it names worker {summary.worker!r}"
        w.summary = summary
        return None

    def alive(self, w: WorkerView, now: float) -> bool:
        if w.static:
            return w.healthy
        if w.load is None:
            return False
        # age measured up to the last successful Redis read: a Redis outage freezes it
        return (self.last_refresh_ok - w.load_changed_at) <= self.dead_after_s and w.healthy

    def routable(self, now: float, model: str | None = None) -> list[WorkerView]:
        """Live, ready workers (those serving ``model`` when some worker lists it:
        :func:`workers_for_model`); suspects only when nothing else is left.

        The model is matched before suspects are set aside: the only worker serving a model, just
        failed, must not make the model look served by nobody (then every worker would qualify, and
        another model's worker would answer the retry)."""
        live = [w for w in self.workers.values() if w.state == "ready" and self.alive(w, now)]
        if model:
            live = workers_for_model(model, live)
        fresh = [w for w in live if w.suspect_until <= now]
        return fresh or live

    def mark_failed(self, worker_id: str, now: float) -> None:
        w = self.workers.get(worker_id)
        if w is not None:
            w.suspect_until = now + SUSPECT_S
            if w.static:
                w.healthy = False  # the health checker brings it back

    # -- per-request scoring -----------------------------------------------------------------------

    def request_hashes(
        self,
        token_bytes: bytes,
        tenant_salt: str | None,
        workers: Iterable[WorkerView],
        model: str | None = None,
        lora_path: str | None = None,
    ) -> dict[tuple[int, int], list[int]]:
        """The request's hash chain under each distinct (seed, block size) among ``workers``: each
        worker's :meth:`request_key` for a request naming ``model`` / ``lora_path``, and the former
        cache names of its own sends (those only for a request under the worker's own identity)."""
        out: dict[tuple[int, int], list[int]] = {}
        for w in workers:
            own = self.cache_key(w)
            key = self.request_key(w, model, lora_path, own)
            for k in (key, *(w.overlay_keys if key is own and w.overlay else ())):
                if k not in out:
                    out[k] = block_hashes(token_bytes, salted_seed(k[0], tenant_salt), k[1])
        return out

    def cache_key(self, w: WorkerView) -> tuple[int, int]:
        """The (identity seed, block size) ``w``'s cache is named by now: what a request naming no
        adapter is hashed under."""
        return (w.identity_seed(self.default_seed), w.block_tokens(self.block_tokens))

    def request_key(
        self,
        w: WorkerView,
        model: str | None,
        lora_path: str | None,
        own: tuple[int, int] | None = None,
    ) -> tuple[int, int]:
        """The (identity seed, block size) a request naming ``model`` / ``lora_path`` is hashed under
        at ``w``: :meth:`cache_key` (``own``, when the caller has it: then that very tuple), unless it
        names a LoRA adapter ``w``'s engine has loaded (``blockhash.request_identity``, the rule the
        worker's sidecar records it by)."""
        if own is None:
            own = self.cache_key(w)
        member = w.member
        if member is None or not member.adapters or (model is None and lora_path is None):
            return own  # the usual worker or request: its own identity, no allocation
        adapter = requested_adapter(member.engine_api, model, lora_path)
        # blockhash.request_identity, tabulated per member record (adapter_seeds)
        seed = w.adapter_seeds(member).get(adapter) if adapter is not None else None
        return own if seed is None else (seed, own[1])

    def route_namespace(
        self, workers: Iterable[WorkerView], model: str | None, lora_path: str | None, tenant_salt: str | None
    ) -> object:
        """The namespace a policy that keeps its own prefix tree (``sglang_cache_aware``) files the
        request under: its tenant salt, or, when it names a LoRA adapter one of ``workers`` has
        loaded, that adapter with the salt (the mirror's :class:`~.mirror.AdapterNamespace`), so an
        adapter's prompts are not taken for the base model's there either."""
        if model is None and lora_path is None:
            return tenant_salt
        for w in workers:
            member = w.member
            if member is not None and member.adapters:
                adapter = requested_adapter(member.engine_api, model, lora_path)
                if adapter is not None and adapter in w.adapter_seeds(member):
                    return AdapterNamespace(adapter, tenant_salt)
        return tenant_salt

    def matched_tokens(
        self, w: WorkerView, hashes: list[int], block_tokens: int, wall_now: float, *, summary: bool = True
    ) -> int:
        """Tokens of ``hashes`` cached at ``w`` by its summary and the overlay (only the overlay when
        ``summary`` is false: ``hashes`` are under a cache name the summary no longer uses)."""
        held = w.summary if summary else None
        # a summary generated since still prunes the overlay: by then it shows what the engine holds
        generated_at = w.summary.generated_at if w.summary is not None else None
        overlay = w.overlay
        floor = wall_now - self.overlay_ttl_s
        if generated_at is not None:
            floor = max(floor, generated_at - OVERLAY_SUMMARY_SLACK_S)

        def present(i: int) -> bool:
            h = hashes[i]
            if held is not None and held.has_block(h):
                return True
            sent = overlay.get(h)
            return sent is not None and sent >= floor

        # Both sources are prefix-closed (a summary keeps parents of what it keeps; a send records its
        # whole chain and re-sending a prefix only refreshes it), so the matched blocks are a prefix
        # of the chain: binary search for its end. A non-holder costs one lookup, a holder log2(n).
        n = len(hashes)
        if n == 0 or not present(0):
            return 0
        if present(n - 1):
            return n * block_tokens
        lo, hi = 0, n - 1  # present(lo), not present(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if present(mid):
                lo = mid
            else:
                hi = mid
        return (lo + 1) * block_tokens

    def replica_states(
        self,
        workers: list[WorkerView],
        hashes: Mapping[tuple[int, int], list[int]],
        num_tokens: int,
        wall_now: float,
        model: str | None = None,
        lora_path: str | None = None,
    ) -> list[ReplicaState]:
        """One row per worker, matched under its :meth:`request_key` for a request naming ``model``
        / ``lora_path`` (``hashes``: :meth:`request_hashes` for the same request)."""
        rows: list[ReplicaState] = []
        for w in workers:
            own = self.cache_key(w)
            key = self.request_key(w, model, lora_path, own)
            matched = self.matched_tokens(w, hashes[key], key[1], wall_now)
            # own sends under the worker's former cache name: for requests under its own identity
            # (an adapter's blocks were never sent under the worker's base names)
            former_keys = w.overlay_keys if key is own else ()
            for old in former_keys:
                if old != key and old in hashes:
                    former = self.matched_tokens(w, hashes[old], old[1], wall_now, summary=False)
                    matched = max(matched, former)
            matched = min(matched, num_tokens)
            load = w.load
            if load is None:
                unreported, ended = list(w.sends.values()), []
            else:
                unreported = [s for s in w.sends.values() if s.sent_at > load.ts]
                # own sends the report counts as in flight though they have ended since: subtract
                # them (a burst right after a reply must not see the replied request as still queued)
                ended = ended_since(w, load.ts)
            in_flight = max((load.in_flight if load else 0) + len(unreported) - len(ended), 0)
            pending = max(
                (load.pending_prefill_tokens if load else 0)
                + sum(s.uncached_tokens for s in unreported)
                - sum(d.uncached_tokens for d in ended),
                0,
            )
            rate = load.prefill_tokens_per_s if load and load.prefill_tokens_per_s > 0 else self.default_rate
            summary = w.summary
            rows.append(
                ReplicaState(
                    replica_id=w.worker_id,
                    matched_tokens=matched,
                    cached_tokens=summary.cached_tokens if summary else 0,
                    capacity_tokens=summary.capacity_tokens if summary else 0,
                    in_flight=in_flight,
                    queued=(load.queued if load else 0) + len(unreported),
                    pending_prefill_tokens=pending,
                    # + the engine's fixed per-step latency, which a lone request waits too
                    wait_s=min(pending / rate + (load.fixed_latency_s if load else 0.0), MAX_WAIT_S),
                    healthy=True,
                    # every gateway's traffic as its sidecar counted it (policies add own sends since)
                    reported_arrivals_per_s=load.arrivals_per_s if load else None,
                    reported_write_tokens_per_s=load.write_tokens_per_s if load else None,
                    reported_at=load.ts if load else 0.0,
                )
            )
        return rows

    # -- own sends ---------------------------------------------------------------------------------

    def record_send(
        self,
        worker_id: str,
        hashes: list[int],
        uncached_tokens: int,
        wall_now: float,
        key: tuple[int, int] | None = None,
    ) -> int:
        """Remember a request sent to ``worker_id`` (overlay + unreported load); returns a handle.
        ``key``: what the caller hashed ``hashes`` under (:meth:`request_key`; None: the worker's
        :meth:`cache_key`). Only sends under the worker's own cache name are remembered as under a
        name it may later drop (an adapter's are matched by the adapter's requests alone)."""
        handle = next(self._send_ids)
        w = self.workers.get(worker_id)
        if w is None:
            return handle
        _add_to_overlay(w.overlay, hashes, wall_now)
        own = self.cache_key(w)
        if key is None or key == own:
            w.overlay_keys.pop(own, None)
            w.overlay_keys[own] = None
            while len(w.overlay_keys) > MAX_OVERLAY_KEYS:
                del w.overlay_keys[next(iter(w.overlay_keys))]
        w.sends[handle] = _Send(wall_now, uncached_tokens)
        return handle

    def record_peer_send(self, worker_id: str, hashes: Iterable[int], sent_at: float) -> None:
        """Another gateway sent a request with this chain to ``worker_id``: until a summary generated
        after it shows the prefix (or its eviction), count it as cached there like an own send.

        Without this, a prefix gateway A just routed is invisible to gateway B until the worker's
        next summary reaches B (a publish plus a refresh interval, more under CPU load), and B
        sends the conversation's next turn elsewhere as a miss. Its load still comes from the
        sidecar's pushed load records.
        """
        w = self.workers.get(worker_id)
        if w is not None:
            _add_to_overlay(w.overlay, hashes, sent_at)

    def record_done(self, worker_id: str, handle: int, wall_now: float | None = None) -> None:
        """The answer to a send ended (``wall_now`` when known: reports older than it still count it)."""
        w = self.workers.get(worker_id)
        if w is None:
            return
        send = w.sends.pop(handle, None)
        if send is not None and wall_now is not None:
            send.done_at = wall_now
            done = w.done
            if done and wall_now < done[-1].done_at:
                # out of order until the entry before it leaves the deque: at most maxlen ends later
                w.done_unordered = done.maxlen or len(done) + 1
            elif w.done_unordered:
                w.done_unordered -= 1
            done.append(send)

    def release_send(self, worker_id: str, hashes: Iterable[int], sent_at: float) -> int:
        """Forget the overlay entries of a send made at ``sent_at`` that never reached the engine's
        cache (it ended before the engine's first token: its client left, the engine failed or
        answered with an error), be it an own send or a peer's withdrawn one
        (``records.SendWithdrawal``). Entries a later send stamped again stay; give only the blocks
        past what was already matched, so the overlay stays prefix-closed. Returns how many entries
        were dropped (0: the worker or that send's stamps are not in the view)."""
        w = self.workers.get(worker_id)
        if w is None:
            return 0
        overlay = w.overlay
        dropped = 0
        for h in hashes:
            if overlay.get(h) == sent_at:
                del overlay[h]
                dropped += 1
        return dropped

    def prune_overlays(self, wall_now: float) -> None:
        """Drop overlay entries a newer summary made redundant or that outlived the TTL."""
        for w in self.workers.values():
            floor = wall_now - self.overlay_ttl_s
            if w.summary is not None:
                floor = max(floor, w.summary.generated_at - OVERLAY_SUMMARY_SLACK_S)
            stale: list[int] = []
            for h, t in w.overlay.items():  # oldest first: stop at the first fresh entry
                if t >= floor:
                    break
                stale.append(h)
            for h in stale:
                del w.overlay[h]
            if not w.overlay:
                w.overlay_keys.clear()


def ended_since(w: WorkerView, ts: float) -> list[_Send]:
    """``w``'s own sends that a load report written at ``ts`` counts as in flight though they have
    ended: sent at or before ``ts``, ended after it. While ``w.done`` is in done_at order (the usual
    case) only the entries ended after ``ts`` are read, newest first, not all MAX_RECENT_DONE (a full
    scan per worker per request was most of the scoring's time); the same sends either way."""
    if w.done_unordered:
        return [d for d in w.done if d.sent_at <= ts < d.done_at]
    ended = []
    for d in reversed(w.done):
        if d.done_at <= ts:
            break  # so did every older one
        if d.sent_at <= ts:
            ended.append(d)
    return ended


def _add_to_overlay(overlay: dict[int, float], hashes: Iterable[int], sent_at: float) -> None:
    for h in hashes:
        # A peer's notice may arrive after a newer send of the same blocks: keep the newer stamp, so
        # a parent's is never older than its child's (matched_tokens' binary search needs the
        # overlay prefix-closed above any floor) and the older send's withdrawal leaves them be.
        old = overlay.pop(h, None)  # re-insert: dict order stays (roughly) oldest-first for trimming
        overlay[h] = sent_at if old is None or old < sent_at else old
    excess = len(overlay) - MAX_OVERLAY_PER_WORKER
    if excess > 0:
        for h in list(itertools.islice(overlay, excess)):
            del overlay[h]
