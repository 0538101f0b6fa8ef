"""prefixfleet's queue-aware cost policy: minimise estimated time to first token, fleet-wide.

Each replica is scored by what choosing it costs:

* its own TTFT: wait before prefill can start + prefill of the suffix it has not cached;
* the delay it imposes: requests that arrive at that replica while this one waits and prefills
  queue behind it, so the prefill is charged again × ``delay_weight`` × the replica's recent
  arrival rate × the time it holds the queue (M/G/1-style head-of-line cost). This is what keeps a
  long miss off the replica that serves a hot tenant's stream of short hits;
* uncached tokens × (``externality`` + ``congestion_weight`` × congestion), where congestion is
  how many times its own cold prefill even the least-loaded replica would make this request wait:
  with slack in the fleet extra work is nearly free, but when every queue is long each uncached
  token is paid for by everyone behind it (without this a continuous-batching fleet at capacity
  spirals: misses add work, work lengthens queues, long queues push requests off their holders);
* for a full cache, the misses its eviction causes later: overflowing tokens × ``eviction_weight``
  × how recently the evicted content was likely used. An LRU cache that turns over in T seconds
  (capacity ÷ the rate of uncached tokens written to it) evicts content last used about
  T ago, so each evicted token is charged ``eviction_weight`` × window/(window + T) of a prefill.
  A small cache churned by long prompts evicts prefixes its tenants are still using, and the charge
  keeps prefix groups from being copied onto it; a large cache that turns over in minutes evicts
  stale content nearly for free, so long cold prompts are not pushed onto busy replicas. Measured
  in the simulator (docs/local-fleet.md): a flat charge of 0.1 gave away hit rate on the Mooncake
  sample of ``prefixfleet compare``; a flat 1.0 failed the mooncake case of ``bench policies``.
  When some replica holds part of the prompt, only the overflow of tokens that *copy* what another
  replica holds is charged (at most the best match minus this replica's). The rest — the suffix
  nobody holds — is written wherever the request goes, and charging it by each replica's turnover
  steered a hot tenant's short hits between its holders by churn instead of queue: on prefixroute
  (4 × 6000 tokens, seed 3) all four replicas were 20–24% busy, yet requests waited 1.5–2.7 ms
  against affinity_balanced's 0.5–1.2 ms at 15–29%. A prompt nobody holds any of is charged on
  all its overflow, as before: where it lands decides whose content it evicts (compare's hit rate).

Both rates — a replica's arrivals and the uncached tokens written to it — are the whole fleet's
when its sidecar reports them (``ReplicaState.reported_*``: every request its worker got, whatever
gateway sent it) plus this gateway's own sends since that report; without a report, this policy's
own sends alone. With G gateways each sees about 1/G of a replica's traffic, so counting only its
own sends made the delay charge G times too small and caches look G times slower to turn over.

Ties go to the replica already holding more of the prompt, then to the shorter queue, then by a
hash of the request's time with the replica id (``base.tie_break``: not the first one listed).

The policy never pays a miss on purpose to copy a hot prefix onto another replica: measured in the
simulator, every such request-path replication rule cost more tail than it saved. Hot prefixes are
replicated by the autoscaler instead, with prefill-only warm-up requests off the request path.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from .base import (
    RATE_WINDOW_S,
    CostModel,
    DecayedRate,
    Decision,
    ReplicaId,
    ReplicaState,
    RouteRequest,
    RoutingPolicy,
    check_param,
    healthy_or_raise,
    least,
)

# Own sends to one replica not yet covered by its sidecar's latest report, at most this many: sends
# within one report's lag (a push follows every load change), so the bound is only reached when
# reports stopped coming; then the oldest are forgotten and the count errs low, not without bound.
MAX_UNREPORTED_SENDS = 4096


class _SinceReport:
    """This gateway's sends to one replica after the time of its sidecar's latest report.

    The report counts every send that reached the sidecar by its ``ts``, this gateway's among them;
    the ones after it are known here only. Rebuilt from the kept sends when a newer report is seen
    (a few sends: those within one report's lag), so reading it costs what reading one rate does.
    Counted over the sidecar's window, RATE_WINDOW_S, as the report it is added to."""

    __slots__ = ("arrivals", "reported_at", "sends", "writes")

    def __init__(self) -> None:
        self.reported_at = -math.inf
        self.sends: deque[tuple[float, float]] = deque(maxlen=MAX_UNREPORTED_SENDS)  # (time, uncached)
        self.arrivals = DecayedRate()
        self.writes = DecayedRate()

    def sync(self, reported_at: float) -> None:
        if reported_at <= self.reported_at:
            return
        self.reported_at = reported_at
        sends = self.sends
        while sends and sends[0][0] <= reported_at:
            sends.popleft()
        self.arrivals, self.writes = DecayedRate(), DecayedRate()
        for t, uncached in sends:
            self.arrivals.add(1.0, t, RATE_WINDOW_S)
            self.writes.add(uncached, t, RATE_WINDOW_S)

    def add(self, t: float, uncached: float) -> None:
        # Sent at or before the report's time: the report counts it (the rule the gateway's view
        # uses for in-flight load, records.LoadReport.ts)
        if t > self.reported_at:
            self.sends.append((t, uncached))
            self.arrivals.add(1.0, t, RATE_WINDOW_S)
            self.writes.add(uncached, t, RATE_WINDOW_S)


class QueueAware(RoutingPolicy):
    name = "queue_aware"
    reasons = ("cache_hit", "load_balance", "no_match")

    def __init__(
        self,
        cost: CostModel | None = None,
        externality: float = 0.0,
        delay_weight: float = 0.25,
        eviction_weight: float = 5.0,
        window_s: float = RATE_WINDOW_S,
        congestion_weight: float = 3.0,
        max_congestion: float = 10.0,
    ) -> None:
        super().__init__(cost)
        for pname, value in (
            ("externality", externality),
            ("delay_weight", delay_weight),
            ("eviction_weight", eviction_weight),
            ("congestion_weight", congestion_weight),
            ("max_congestion", max_congestion),
        ):
            check_param(pname, value)
        check_param("window_s", window_s, strict=True)
        self.externality = externality
        self.delay_weight = delay_weight
        self.eviction_weight = eviction_weight
        self.window_s = window_s
        self.congestion_weight = congestion_weight
        self.max_congestion = max_congestion
        self._arrivals: dict[ReplicaId, DecayedRate] = {}
        self._writes: dict[ReplicaId, DecayedRate] = {}  # uncached tokens sent: what churns each cache
        # replicas whose sidecars report their rates: own sends since their latest report
        self._since: dict[ReplicaId, _SinceReport] = {}

    # -- what the policy has learned from its own decisions -------------------------------------

    def arrival_rate(self, replica_id: ReplicaId, now: float) -> float:
        """The rate of requests this policy itself has sent ``replica_id``."""
        d = self._arrivals.get(replica_id)
        return d.rate(now, self.window_s) if d else 0.0

    def _since_report(self, r: ReplicaState) -> _SinceReport:
        since = self._since.get(r.replica_id)
        if since is None:
            since = self._since[r.replica_id] = _SinceReport()
        since.sync(r.reported_at)
        return since

    def _fleet_rate(self, reported: float, own_since: DecayedRate, r: ReplicaState, now: float) -> float:
        """A replica's rate from every gateway: its sidecar's report, decayed from the report's time
        to ``now``, plus this gateway's own sends since that time.

        Why not max(own, reported): with G gateways in front of the fleet the report is about G
        times this gateway's share, and max would drop every send made since the report (this
        gateway's burst, or all the others'). Reported + own-since counts each send once: the report
        holds all sends up to its time (this gateway's too), own-since the ones after it that this
        gateway knows of. With one gateway it equals the policy's own count (the report then holds
        exactly its sends); with G it misses only the other gateways' sends within the report's lag
        (milliseconds with load pushes: far inside the window).

        Both terms are over the sidecar's window (RATE_WINDOW_S) whatever ``window_s`` is: the
        report is a rate over that window, and decaying it and adding own sends over another one
        gave neither window's rate (one gateway, 10 req/s for 10 s, read 3 s after a report 3 s
        old: window_s 30 read 1.11x and window_s 3 0.68x what the sidecar counted)."""
        decay = math.exp(-max(now - r.reported_at, 0.0) / RATE_WINDOW_S)
        return reported * decay + own_since.rate(now, RATE_WINDOW_S)

    def replica_arrival_rate(self, r: ReplicaState, now: float) -> float:
        """``r``'s recent arrival rate: from every gateway when its sidecar reports it, else the
        rate of this policy's own sends (a static worker, an older sidecar, the simulator)."""
        if r.reported_arrivals_per_s is None:
            return self.arrival_rate(r.replica_id, now)
        return self._fleet_rate(r.reported_arrivals_per_s, self._since_report(r).arrivals, r, now)

    def write_rate(self, r: ReplicaState, now: float) -> float:
        """Uncached tokens per second written to ``r``'s cache (reported, or this policy's own)."""
        if r.reported_write_tokens_per_s is None:
            d = self._writes.get(r.replica_id)
            return d.rate(now, self.window_s) if d else 0.0
        return self._fleet_rate(r.reported_write_tokens_per_s, self._since_report(r).writes, r, now)

    def turnover_s(self, r: ReplicaState, now: float) -> float:
        """Seconds for the new tokens written to ``r`` to fill its cache once (inf: none written)."""
        rate = self.write_rate(r, now)
        return r.capacity_tokens / rate if rate > 0 else math.inf

    def eviction_cost_per_token(self, r: ReplicaState, now: float) -> float:
        """What evicting one token of ``r``'s LRU tail costs later, in prefill seconds."""
        turnover = self.turnover_s(r, now)
        if math.isinf(turnover):
            return 0.0
        recency = self.window_s / (self.window_s + turnover)
        return self.eviction_weight * recency * self.cost.prefill_s_per_token

    # -- scoring ------------------------------------------------------------------------------

    def congestion(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> float:
        """How many times its own prefill even the least-loaded replica would make this request wait.

        Near 0 the fleet has slack and extra work is nearly free; when every queue is long, each
        uncached token is work the whole fleet pays for again, so misses get dearer.
        """
        full = self.cost.prefill_s(request.num_tokens, 0)
        if full <= 0:
            return 0.0
        return min(min(r.wait_s for r in replicas) / full, self.max_congestion)

    def score(
        self, request: RouteRequest, r: ReplicaState, congestion: float = 0.0, best_match: int = 0
    ) -> float:
        """Estimated cost of sending ``request`` to ``r``, in seconds.

        ``best_match``: the longest cached prefix of the request on any replica (0: nobody holds
        any of it), which decides what of ``r``'s overflow is charged as eviction.
        """
        uncached = request.num_tokens - r.matched_tokens
        prefill = self.cost.prefill_s(request.num_tokens, r.matched_tokens)
        lam = self.replica_arrival_rate(r, request.now)
        extra = self.delay_weight * lam * prefill * (r.wait_s + prefill / 2)
        factor = self.externality + self.congestion_weight * congestion
        extra += factor * uncached * self.cost.prefill_s_per_token
        if r.capacity_tokens:
            overflow = r.cached_tokens + uncached - r.capacity_tokens
            best_match = max(best_match, r.matched_tokens)
            if best_match > 0:  # the suffix nobody holds is written wherever the request goes
                overflow = min(overflow, best_match - r.matched_tokens)
            if overflow > 0:  # the churn rate is only worth reading when something is evicted
                extra += overflow * self.eviction_cost_per_token(r, request.now)
        return r.wait_s + prefill + extra

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> Decision:
        live = healthy_or_raise(replicas)
        congestion = self.congestion(request, live)
        best_match = max(r.matched_tokens for r in live)
        scores = {r.replica_id: self.score(request, r, congestion, best_match) for r in live}
        chosen = least(request, live, lambda r: (scores[r.replica_id], -r.matched_tokens, r.wait_s))
        if best_match == 0:
            return Decision(chosen.replica_id, "no_match", 0, scores)
        if chosen.matched_tokens < best_match:
            return Decision(chosen.replica_id, "load_balance", chosen.matched_tokens, scores)
        return Decision(chosen.replica_id, "cache_hit", chosen.matched_tokens, scores)

    # -- feedback -------------------------------------------------------------------------------

    def on_routed(self, request: RouteRequest, decision: Decision) -> None:
        arrivals = self._arrivals.setdefault(decision.replica_id, DecayedRate())
        arrivals.add(1.0, request.now, self.window_s)
        writes = self._writes.setdefault(decision.replica_id, DecayedRate())
        uncached = max(request.num_tokens - decision.expected_matched_tokens, 0)
        writes.add(float(uncached), request.now, self.window_s)
        since = self._since.get(decision.replica_id)
        if since is not None:  # its sidecar reports: remember the send until a report covers it
            since.add(request.now, float(uncached))

    def on_replica_removed(self, replica_id: ReplicaId) -> None:
        self._arrivals.pop(replica_id, None)
        self._writes.pop(replica_id, None)
        self._since.pop(replica_id, None)
