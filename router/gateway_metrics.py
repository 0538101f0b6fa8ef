"""Prometheus metrics of one gateway (a registry per app: several gateways can share a process)."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .hotspots import HotSubtree

# LLM-sized: first tokens arrive in tens of ms to tens of seconds
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
DECISION_BUCKETS = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 0.1)
ERROR_KINDS = ("bad_request", "no_worker", "upstream", "timeout", "stream_cut")
RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
WITHDRAWAL_SENT_OUTCOMES = ("published", "failed")
WITHDRAWAL_RECEIVED_OUTCOMES = ("applied", "unknown")


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        p = "prefixfleet_gateway_"
        self.requests = Counter(
            p + "requests",
            "Requests answered, by endpoint and HTTP status.",
            ["endpoint", "code"],
            registry=r,
        )
        self.errors = Counter(
            p + "errors", "Failures, by kind (bad_request, no_worker, upstream, ...).", ["kind"], registry=r
        )
        for kind in ERROR_KINDS:
            self.errors.labels(kind)  # export every kind at 0: rate() and alerts see a series from the start
        self.retries = Counter(
            p + "retries", "Requests re-sent to another worker after a failure.", registry=r
        )
        self.decisions = Counter(
            p + "routing_decisions",
            "Routing decisions, by policy and reason.",
            ["policy", "reason"],
            registry=r,
        )
        self.matched_ratio = Histogram(
            p + "matched_token_ratio",
            "Share of a request's prompt tokens cached on the chosen worker (as the gateway estimated it).",
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.worker_in_flight = Gauge(
            p + "worker_in_flight",
            "Requests in flight per worker (reported + this gateway's unreported).",
            ["worker"],
            registry=r,
        )
        self.summary_staleness = Gauge(
            p + "summary_staleness_seconds",
            "Age of the newest cache summary seen from each worker.",
            ["worker"],
            registry=r,
        )
        self.workers = Gauge(p + "workers", "Workers in the view, by routability.", ["status"], registry=r)
        self.decision_latency = Histogram(
            p + "decision_latency_seconds",
            "Time to pick a worker (tokenize excluded).",
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            p + "ttft_seconds",
            "Time from request arrival to the first streamed byte sent to the client.",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            p + "request_duration_seconds",
            "Time from request arrival to the last byte sent, by endpoint.",
            ["endpoint"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.redis_up = Gauge(p + "redis_up", "1 when the last read of Redis succeeded.", registry=r)
        # A lost withdrawal leaves peers counting the send as a hit until a summary or the overlay
        # TTL: without these, a Redis that drops them looks the same as one that delivers them.
        self.send_withdrawals = Counter(
            p + "send_withdrawals",
            "Own sends withdrawn for the peers (ended before the first token), by outcome: "
            "published, failed (lost to a Redis error).",
            ["outcome"],
            registry=r,
        )
        self.peer_send_withdrawals = Counter(
            p + "peer_send_withdrawals",
            "Peers' send withdrawals read from the sends channel, by outcome: applied (entries "
            "dropped), unknown (nothing of that send in this view).",
            ["outcome"],
            registry=r,
        )
        for outcome in WITHDRAWAL_SENT_OUTCOMES:
            self.send_withdrawals.labels(outcome)
        for outcome in WITHDRAWAL_RECEIVED_OUTCOMES:
            self.peer_send_withdrawals.labels(outcome)
        self._answered: dict[tuple[str, int], tuple[Counter, Histogram]] = {}
        self._routed: dict[tuple[str, str, str], tuple[Counter, Counter, Counter, Counter]] = {}
        # Token-weighted hit estimates: sum(matched) / sum(prompt) per reason, unlike the per-request
        # ratio histogram above, weighs a long prompt more than a short one.
        self.prompt_tokens = Counter(
            p + "prompt_tokens",
            "Prompt tokens of routed requests, by policy and routing reason.",
            ["policy", "reason"],
            registry=r,
        )
        self.matched_tokens = Counter(
            p + "matched_tokens",
            "Prompt tokens the gateway expected cached on the chosen worker, by policy and reason.",
            ["policy", "reason"],
            registry=r,
        )
        self.worker_routed = Counter(
            p + "worker_routed_requests",
            "Requests sent to each worker (retries included): the load share per replica.",
            ["worker"],
            registry=r,
        )
        self.workers_in_state = Gauge(
            p + "workers_in_state",
            "Workers in the view by member state (ready, warming = pre-warming, draining).",
            ["state"],
            registry=r,
        )
        self.hot_subtree_hits = Gauge(
            p + "hot_subtree_hits",
            "Hits recorded at the root of the fleet's rank-th hottest prefix subtree, summed over holders.",
            ["rank"],
            registry=r,
        )
        self.hot_subtree_tokens = Gauge(
            p + "hot_subtree_tokens",
            "Prefix length (tokens) at the root of the rank-th hottest subtree.",
            ["rank"],
            registry=r,
        )
        self.hot_subtree_holders = Gauge(
            p + "hot_subtree_holders",
            "Workers whose summary lists the rank-th hottest subtree as hot.",
            ["rank"],
            registry=r,
        )
        # set_hot_subtrees' last series: (rank, holders) per subtree, and their children in order
        self._hot_labels: tuple[tuple[int, tuple[str, ...]], ...] | None = None
        self._hot_children: list[Gauge] = []
        self.hot_subtree_worker_hits = Gauge(
            p + "hot_subtree_worker_hits",
            "Hits of the rank-th hottest subtree on each worker holding it (where hot prefixes live).",
            ["rank", "worker"],
            registry=r,
        )

    def request_answered(self, endpoint: str, code: int, seconds: float) -> None:
        """Hot path: label children are cached (``labels()`` takes a lock and builds a key each call)."""
        key = (endpoint, code)
        children = self._answered.get(key)
        if children is None:
            children = (self.requests.labels(endpoint, str(code)), self.duration.labels(endpoint))
            if len(self._answered) < 256:  # endpoints x codes: small and fixed
                self._answered[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def routed(self, policy: str, reason: str, worker: str, prompt_tokens: int, matched_tokens: int) -> None:
        """Hot path: one routing decision's counters, with their label children cached."""
        key = (policy, reason, worker)
        children = self._routed.get(key)
        if children is None:
            children = (
                self.decisions.labels(policy, reason),
                self.prompt_tokens.labels(policy, reason),
                self.matched_tokens.labels(policy, reason),
                self.worker_routed.labels(worker),
            )
            if len(self._routed) < 4096:  # policy reasons x workers: bounded by the fleet
                self._routed[key] = children
        children[0].inc()
        children[1].inc(prompt_tokens)
        children[2].inc(matched_tokens)
        children[3].inc()

    def forget_worker(self, worker: str) -> None:
        self._routed = {k: v for k, v in self._routed.items() if k[2] != worker}
        for metric in (self.worker_in_flight, self.summary_staleness, self.worker_routed):
            with contextlib.suppress(KeyError):
                metric.remove(worker)

    def set_hot_subtrees(self, ranked: list[HotSubtree]) -> None:
        """Replace the rank-labelled series (labels: rank 1..K and worker ids only, never a hash).

        A summary changes a few times a second and the ranks' holders rarely do: when the series
        are the ones already exported (same ranks, same holders, same order) only their values are
        set, on the children kept from the last rebuild, which otherwise (clearing the gauges and
        creating every child again) costs ~250 µs each time. The exposition is the same either way."""
        labels = tuple((subtree.rank, tuple(worker for worker, _ in subtree.holders)) for subtree in ranked)
        if labels == self._hot_labels:
            children = iter(self._hot_children)
            for subtree in ranked:
                next(children).set(subtree.hits)
                next(children).set(subtree.tokens)
                next(children).set(len(subtree.holders))
                for _, hits in subtree.holders:
                    next(children).set(hits)
            return
        self._hot_labels = labels
        self._hot_children = []
        for gauge in (
            self.hot_subtree_hits,
            self.hot_subtree_tokens,
            self.hot_subtree_holders,
            self.hot_subtree_worker_hits,
        ):
            gauge.clear()
        kept = self._hot_children
        for subtree in ranked:
            rank = str(subtree.rank)
            kept.append(self.hot_subtree_hits.labels(rank))
            kept[-1].set(subtree.hits)
            kept.append(self.hot_subtree_tokens.labels(rank))
            kept[-1].set(subtree.tokens)
            kept.append(self.hot_subtree_holders.labels(rank))
            kept[-1].set(len(subtree.holders))
            for worker, hits in subtree.holders:
                kept.append(self.hot_subtree_worker_hits.labels(rank, worker))
                kept[-1].set(hits)
