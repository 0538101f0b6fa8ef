"""The summary's hot nodes are ranked from the last summary's top and the paths touched since
(router.summary.BlockIndex._ranked_since), not from every node, and are still exactly what a
from-scratch walk of the tree ranks (router.summary.build_summary).

Specification:
* after any sequence of admitted prompts (sharing prefixes, splitting edges, evicting), withdrawn
  ones, corrections, resizes, flushes and summaries asking for various numbers of hot nodes, each
  summary equals a rebuild from the tree: blocks, hot nodes (hash, tokens, hits, time) and the hot
  prefixes kept for pre-warming;
* in a steady run (a cache that evicts, prompts on shared system prompts) most summaries rank only
  the touched paths (the full ranking is the exception, not the rule);
* a sidecar that builds no summary keeps a bounded set of touched paths.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from test_summary_index import B, _same_summary, prompts

from prefixfleet.router.blockhash import CacheIdentity
from prefixfleet.router.mirror import CacheMirror
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.summary import _MAX_TOUCHED

# no two namespaces sharing a seed (None and "" do): the ranking kept between summaries serves
# exactly these trees (the shared case ranks every node, as before)
namespaces = st.sampled_from([None, "tenant-a", "tenant-b"])
kinds = st.sampled_from(
    ["admit", "admit", "admit", "withdraw", "correct", "resize", "flush", "summary", "summary"]
)
operations = st.lists(st.tuples(kinds, prompts, namespaces, st.integers(1, 120)), max_size=80)


def assert_same_summary(mirror: CacheMirror, hot_k: int) -> None:
    _same_summary(mirror, hot_k=hot_k)
    assert mirror.index.full_rankings >= 1  # the first summary ranked every node


def tokens(prompt: list[int]) -> bytes:
    return as_token_bytes([10 + t for t in prompt])


@settings(max_examples=400, deadline=None)
@given(ops=operations, capacity=st.integers(8, 100))
def test_the_kept_hot_ranking_equals_a_rebuild_after_any_operations(ops, capacity) -> None:
    mirror = CacheMirror(capacity, CacheIdentity("m", "r"), block_tokens=B, clock=lambda: 0.0)
    for kind, prompt, namespace, n in [*ops, ("summary", [], None, 3)]:
        if kind == "admit":
            mirror.admit(tokens(prompt), namespace)
        elif kind == "withdraw":  # a request that ended before the engine's first token
            mirror.withdraw(mirror.admit_sent(tokens(prompt), namespace))
        elif kind == "correct":
            mirror.correct(n, 0, ran_alone=True)
        elif kind == "resize":
            mirror.resize(max(n, 8))
        elif kind == "flush":
            mirror.flush()
        else:
            assert_same_summary(mirror, hot_k=1 + n % 6)


def test_a_steady_run_ranks_only_the_touched_paths_and_matches_a_rebuild() -> None:
    rng = random.Random(11)
    systems = [[rng.randrange(1000) for _ in range(rng.randrange(8, 40))] for _ in range(6)]
    mirror = CacheMirror(3000, CacheIdentity("m", "r"), block_tokens=B, clock=lambda: 0.0)
    summaries = 0
    for i in range(1500):
        tail = [rng.randrange(1000) for _ in range(rng.randrange(1, 30))]
        prompt = as_token_bytes(systems[i % len(systems)] + tail)
        namespace = rng.choice([None, "tenant-a"])
        mirror.admit(prompt, namespace)
        mirror.admit(prompt + as_token_bytes([rng.randrange(1000)]), namespace)  # its answer
        if i % 20 == 0:
            assert_same_summary(mirror, hot_k=8)
            summaries += 1
    assert mirror.tree.evictions_total > 0
    # the first summary ranks everything; so may one whose last top lost a node (evicted)
    assert mirror.index.full_rankings < summaries // 2, (mirror.index.full_rankings, summaries)


def test_without_summaries_the_touched_paths_kept_are_bounded() -> None:
    mirror = CacheMirror(100_000, CacheIdentity("m", "r"), block_tokens=B, clock=lambda: 0.0)
    for i in range(_MAX_TOUCHED + 10):
        mirror.admit(as_token_bytes([i, i + 1, i + 2, i + 3, i + 4]), None)
    touched = mirror.index._touched
    assert touched is None or len(touched) <= _MAX_TOUCHED
    assert_same_summary(mirror, hot_k=8)  # and the next summary ranks every node, right
