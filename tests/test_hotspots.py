"""Where hot prefix subtrees live: ranking the workers' hot nodes fleet-wide (pure, no I/O)."""

from __future__ import annotations

from prometheus_client import generate_latest

from prefixfleet.router.gateway_metrics import GatewayMetrics
from prefixfleet.router.hotspots import rank_hot_subtrees
from prefixfleet.router.summary import HotNode, Summary, make_summary


def summary(worker: str, *hot: tuple[int, int, int]) -> Summary:
    nodes = [HotNode(hash=h, tokens=t, hits=n, last_access=0.0) for h, t, n in hot]
    return make_summary(
        worker=worker,
        version=1,
        generated_at=0.0,
        block_tokens=16,
        identity_seed=7,
        cached_tokens=0,
        capacity_tokens=1000,
        blocks=[],
        hot=nodes,
    )


def test_a_subtree_held_by_several_workers_sums_their_hits_and_names_each_holder() -> None:
    ranked = rank_hot_subtrees(
        [summary("w0", (0xA, 64, 30), (0xB, 32, 5)), summary("w1", (0xA, 64, 10)), summary("w2")]
    )
    assert [(s.rank, s.hits, s.tokens) for s in ranked] == [(1, 40, 64), (2, 5, 32)]
    assert ranked[0].holders == (("w0", 30), ("w1", 10))
    assert ranked[1].holders == (("w0", 5),)


def test_only_the_k_hottest_are_kept() -> None:
    ranked = rank_hot_subtrees([summary("w0", *[(h, 16, h) for h in range(1, 20)])], k=3)
    assert [s.hits for s in ranked] == [19, 18, 17]


def test_metrics_label_subtrees_by_rank_and_worker_never_by_hash() -> None:
    metrics = GatewayMetrics()
    metrics.set_hot_subtrees(rank_hot_subtrees([summary("w0", (0xDEADBEEF, 64, 3))]))
    text = generate_latest(metrics.registry).decode()
    assert 'prefixfleet_gateway_hot_subtree_worker_hits{rank="1",worker="w0"} 3.0' in text
    assert "deadbeef" not in text.lower()
    metrics.set_hot_subtrees([])  # the fleet cooled down: stale ranks disappear
    assert "hot_subtree_worker_hits{" not in generate_latest(metrics.registry).decode()
