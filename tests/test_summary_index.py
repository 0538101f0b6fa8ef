"""The mirror's incrementally kept summary is the summary a from-scratch walk of its tree gives."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixfleet.router.blockhash import CacheIdentity
from prefixfleet.router.mirror import CacheMirror
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.summary import build_summary

B = 4
# Few token values and short prompts: prompts share prefixes, split each other's edges and evict.
prompts = st.lists(st.integers(0, 3), min_size=4, max_size=24)
# None and "" hash with the same (unsalted) seed: the same prompt in both is the same block hashes.
namespaces = st.sampled_from([None, "", "tenant-a"])
admits = st.tuples(st.just("admit"), prompts, namespaces)
operations = st.lists(
    st.one_of(
        admits,
        admits,
        admits,
        admits,  # mostly prompts: trees that grow, share and evict
        st.tuples(st.just("correct"), st.integers(1, 60)),
        st.tuples(st.just("resize"), st.integers(8, 120)),
        st.tuples(st.just("flush")),
        st.tuples(st.just("summary")),
    ),
    max_size=60,
)


def _rebuilt(mirror: CacheMirror, *, max_blocks: int, hot_k: int):
    return build_summary(
        mirror.tree,
        worker="w",
        version=1,
        now=0.0,
        identity_seed=mirror.identity_seed,
        block_tokens=B,
        namespace_seed=mirror.namespace_seed,
        wall_time_of=mirror.wall_time_of,
        max_blocks=max_blocks,
        hot_k=hot_k,
    )


def _same_summary(mirror: CacheMirror, *, max_blocks: int = 10_000, hot_k: int = 8) -> None:
    """The kept summary and hot prefixes equal a from-scratch walk's."""
    kept = mirror.summary(worker="w", version=1, max_blocks=max_blocks, hot_k=hot_k)
    fresh, fresh_exports = _rebuilt(mirror, max_blocks=max_blocks, hot_k=hot_k)
    assert list(kept.blocks) == list(fresh.blocks)
    assert kept == fresh  # every other field: counts, hot nodes, truncation
    assert mirror.hot_prefixes == fresh_exports


@settings(max_examples=300, deadline=None)
@given(
    ops=operations,
    capacity=st.integers(8, 100),
    max_blocks=st.integers(1, 24),
    hot_k=st.integers(1, 6),
)
def test_incremental_summary_equals_a_rebuild_after_any_inserts_and_evictions(
    ops, capacity, max_blocks, hot_k
):
    mirror = CacheMirror(capacity, CacheIdentity("m", "r"), block_tokens=B, clock=lambda: 0.0)
    for op in [*ops, ("summary",)]:
        if op[0] == "admit":
            mirror.admit(as_token_bytes([10 + t for t in op[1]]), op[2])
        elif op[0] == "correct":
            mirror.correct(op[1], 0, ran_alone=True)
        elif op[0] == "resize":
            mirror.resize(op[1])
        elif op[0] == "flush":
            mirror.flush()
        else:
            _same_summary(mirror, max_blocks=max_blocks, hot_k=hot_k)


def test_incremental_summary_equals_a_rebuild_over_a_long_run_of_shared_prefixes():
    """Hundreds of prompts on a few system prompts, a full cache evicting all along, and a cap that
    keeps only the most recent blocks: the kept summary still matches a fresh walk."""
    rng = random.Random(7)
    systems = [[rng.randrange(1000) for _ in range(rng.randrange(8, 40))] for _ in range(6)]
    mirror = CacheMirror(1500, CacheIdentity("m", "r"), block_tokens=B, clock=lambda: 0.0)
    for i in range(600):
        tail = [rng.randrange(1000) for _ in range(rng.randrange(1, 30))]
        mirror.admit(as_token_bytes(systems[i % len(systems)] + tail), rng.choice([None, "", "tenant-a"]))
        if i % 97 == 0:
            mirror.correct(200, 0, ran_alone=True)
        if i % 50 == 0:
            for max_blocks in (10_000, 150):
                _same_summary(mirror, max_blocks=max_blocks, hot_k=8)
    assert mirror.tree.evictions_total > 0
