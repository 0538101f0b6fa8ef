"""Chained block hashes: how a prompt prefix is named outside the pod that saw it.

A prompt's tokens are cut into fixed-size blocks (``block_tokens``, 16 by default like llm-d). Block
*i*'s hash is xxhash64 of its little-endian uint32 token bytes, seeded with block *i-1*'s hash; block
0 is seeded with the *cache identity* seed (model + revision + adapter, then mixed with an optional
tenant salt). So a hash names a whole prefix, two requests share a block hash exactly as far as they
share whole blocks of prefix under the same identity, and the raw tokens never leave the sidecar.
A partial last block is not hashed: engines cache and match whole pages, and a partial block cannot
be named stably.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import xxhash

from .radix import TOKEN_BYTES, Tokens, as_token_bytes

DEFAULT_BLOCK_TOKENS = 16
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class CacheIdentity:
    """Everything that makes a cached prefix reusable: a change of any field is a different cache."""

    model: str = ""
    revision: str = ""
    adapter: str = ""

    def seed(self) -> int:
        """64-bit seed of block 0 for this identity (no tenant salt)."""
        key = "\x1f".join(("prefixfleet-v1", self.model, self.revision, self.adapter))
        return xxhash.xxh64_intdigest(key.encode("utf-8"))


def salted_seed(identity_seed: int, tenant_salt: str | None) -> int:
    """Seed for one tenant under ``identity_seed``; ``None``/empty salt is the shared (unsalted) seed."""
    if not tenant_salt:
        return identity_seed
    return xxhash.xxh64_intdigest(tenant_salt.encode("utf-8"), seed=identity_seed & _MASK64)


def block_hashes(tokens: Tokens, seed: int, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> list[int]:
    """Chained hashes of every *full* block of ``tokens`` (a list of ``len(tokens) // block_tokens``)."""
    data = as_token_bytes(tokens)
    return list(iter_block_hashes(data, seed, block_tokens))


def iter_block_hashes(data: bytes, seed: int, block_tokens: int) -> Iterator[int]:
    """Lazy form of :func:`block_hashes` over already-encoded token bytes."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    step = block_tokens * TOKEN_BYTES
    h = seed & _MASK64
    digest = xxhash.xxh64_intdigest
    for start in range(0, len(data) - step + 1, step):
        h = digest(data[start : start + step], seed=h)
        yield h


def extend_chain(prev_hash: int, leftover: bytes, edge: bytes, block_tokens: int) -> tuple[list[int], bytes]:
    """Continue a hash chain over ``leftover + edge`` (tree walks hash edge by edge).

    Returns the hashes of the full blocks completed and the bytes of the new partial block.
    """
    data = leftover + edge
    step = block_tokens * TOKEN_BYTES
    full = len(data) - len(data) % step
    hashes = list(iter_block_hashes(data[:full], prev_hash, block_tokens))
    return hashes, data[full:]
