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

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from functools import lru_cache

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


@lru_cache(maxsize=1024)
def identity_seed(identity: CacheIdentity) -> int:
    """``identity.seed()``, remembered: a request naming an adapter is hashed under that adapter's
    identity on every such request, and the few adapters a fleet serves are seeded once each."""
    return identity.seed()


# The engine APIs whose rule for naming a LoRA adapter in a request is known (engine_api.SGLANG, VLLM).
_SGLANG = "sglang"
_VLLM = "vllm"


def requested_adapter(engine_api: str, model: str | None, lora_path: str | None) -> str | None:
    """The adapter name a request asks an engine speaking ``engine_api`` for, by that engine's own
    rule; None: none (the base model). Whether the engine has such an adapter is
    :func:`request_identity`'s question.

    * vLLM: the request's ``model`` is a served name or a LoRA adapter's name (its ``/v1/models``
      lists each adapter with a ``parent``); a ``lora_path`` field is ignored by vLLM.
    * SGLang (``serving_base._resolve_lora_path``): ``model`` of the form ``"base:adapter"``, split at
      its first ``:`` and stripped, names the adapter (an empty part after the ``:`` names none);
      else the request's ``lora_path`` (``/generate`` and, as an extra field, the OpenAI routes; a
      batch's is its first prompt's). A bare adapter name as ``model`` is the base model there.
    * Any other API: none (its rule is not known; its requests keep the worker's identity).
    """
    if engine_api == _VLLM:
        return model or None
    if engine_api == _SGLANG:
        if model and ":" in model:
            adapter = model.split(":", 1)[1].strip()
            if adapter:
                return adapter
        return lora_path or None
    return None


def request_identity(
    configured: CacheIdentity,
    adapters: Collection[str],
    engine_api: str,
    model: str | None,
    lora_path: str | None,
) -> CacheIdentity:
    """The cache identity a request is hashed under on a worker whose configured identity is
    ``configured``, whose engine speaks ``engine_api`` and has the LoRA ``adapters`` loaded.

    vLLM keys its KV blocks per LoRA adapter (the adapter is among a block hash's extra keys) and
    SGLang keys its radix cache per adapter too, so a prompt cached under one adapter (or the base
    model) is a miss under another. A request naming one of ``adapters`` (:func:`requested_adapter`)
    is hashed with that adapter in the identity; a request naming the base model, an alias, an
    adapter this worker does not have, or nothing keeps ``configured``. The one rule the gateway
    (hashing a request per worker) and the sidecar's mirror (recording it) both apply."""
    if not adapters:  # the usual worker: nothing to look up
        return configured
    adapter = requested_adapter(engine_api, model, lora_path)
    if adapter is None or adapter == configured.adapter or adapter not in adapters:
        return configured
    return CacheIdentity(configured.model, configured.revision, adapter)


def adapter_seeds(configured: CacheIdentity, adapters: Collection[str]) -> dict[str, int]:
    """:func:`request_identity` tabulated for a worker: the seed of each adapter name a request may
    name there to be hashed under another identity than ``configured`` (absent: ``configured``).
    ``adapter_seeds(c, a).get(requested_adapter(api, model, lora_path))`` is the seed of
    ``request_identity(c, a, api, model, lora_path)`` whenever that is not ``c``, else None: a
    gateway builds it once per member record instead of an identity per request per worker."""
    return {
        adapter: identity_seed(CacheIdentity(configured.model, configured.revision, adapter))
        for adapter in adapters
        if adapter != configured.adapter
    }


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
