"""Chained block hashes as a specification: what a hash names, checked against a plain reference.

The reference hashes each full block with xxhash64 over its little-endian uint32 token bytes,
seeded with the previous block's hash (block 0: the seed), written out with ``struct`` and a loop;
peers in other languages compute exactly this, so the definition itself is what is pinned.
"""

from __future__ import annotations

import itertools
import struct

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixfleet.router.blockhash import (
    CacheIdentity,
    block_hashes,
    extend_chain,
    salted_seed,
)
from prefixfleet.router.radix import as_token_bytes

# Two token values and tiny blocks: equal blocks under different prefixes are common.
tokens = st.lists(st.integers(0, 1), max_size=24)
block_sizes = st.integers(1, 4)
seeds = st.integers(0, 2**64 - 1)


def reference_hashes(seq: list[int], seed: int, block: int) -> list[int]:
    out: list[int] = []
    h = seed
    for i in range(len(seq) // block):
        data = b"".join(struct.pack("<I", t) for t in seq[i * block : (i + 1) * block])
        h = xxhash.xxh64_intdigest(data, seed=h)
        out.append(h)
    return out


@settings(max_examples=100, deadline=None)
@given(seq=tokens, seed=seeds, block=block_sizes)
def test_block_hashes_are_the_chained_xxhash64_of_every_full_block(seq, seed, block):
    got = block_hashes(seq, seed, block)
    assert got == reference_hashes(seq, seed, block)
    assert len(got) == len(seq) // block  # a partial last block is not named


@settings(max_examples=100, deadline=None)
@given(a=tokens, b=tokens, seed=seeds, block=block_sizes)
def test_two_prompts_share_a_block_hash_exactly_as_far_as_they_share_whole_blocks(a, b, seed, block):
    ha, hb = block_hashes(a, seed, block), block_hashes(b, seed, block)
    for i in range(min(len(ha), len(hb))):
        same_prefix = a[: (i + 1) * block] == b[: (i + 1) * block]
        assert (ha[i] == hb[i]) == same_prefix, (i, a, b)


@settings(max_examples=100, deadline=None)
@given(seq=tokens, seed=seeds, block=block_sizes, data=st.data())
def test_hashing_edge_by_edge_gives_the_hashes_of_the_whole_path(seq, seed, block, data):
    """A tree walk continues the chain over its edges, whatever the edge boundaries are."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(seq)), max_size=5)))
    bounds = [0, *cuts, len(seq)]
    h, leftover, got = seed, b"", []
    for lo, hi in itertools.pairwise(bounds):
        hashes, leftover = extend_chain(h, leftover, as_token_bytes(seq[lo:hi]), block)
        got += hashes
        h = hashes[-1] if hashes else h
    assert got == block_hashes(seq, seed, block)
    assert leftover == as_token_bytes(seq[len(seq) - len(seq) % block :])


def test_every_field_of_the_cache_identity_and_the_tenant_salt_changes_the_seed():
    base = CacheIdentity("m", "r", "a")
    variants = [
        base,
        CacheIdentity("m2", "r", "a"),
        CacheIdentity("m", "r2", "a"),
        CacheIdentity("m", "r", ""),
    ]
    seeds_ = {v.seed() for v in variants}
    assert len(seeds_) == len(variants)
    # fields are kept apart: moving text from one field to the next is another identity
    assert CacheIdentity("ab", "c").seed() != CacheIdentity("a", "bc").seed()
    s = base.seed()
    assert salted_seed(s, None) == salted_seed(s, "") == s  # no salt: the shared cache
    salted = {salted_seed(s, "tenant-a"), salted_seed(s, "tenant-b")}
    assert len(salted) == 2 and s not in salted
    assert salted_seed(s, "tenant-a") == salted_seed(s, "tenant-a")  # stable across calls


def test_a_block_size_of_zero_is_refused():
    with pytest.raises(ValueError, match="block_tokens must be positive"):
        block_hashes([1, 2, 3], 0, 0)
