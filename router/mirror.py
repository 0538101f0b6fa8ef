"""A sidecar's mirror of its engine's prefix cache (pure state; the sidecar feeds it, publishes it).

The sidecar sees every prompt its engine serves, so inserting each admitted prompt into a radix tree
of the engine's capacity reproduces the engine's radix cache closely (same LRU policy). Where the
engine reports ``cached_tokens`` lower than the mirror predicted for a request that ran alone, the
engine holds less than the mirror thinks; the mirror then evicts the difference from its LRU end.
A prompt is admitted when it is sent, before the engine prefilled it, so that the summary shows it
at once; a request that ends before the engine's first token (client gone, engine failed, an error
answer) takes its new tokens back (:meth:`CacheMirror.withdraw`).
"""

from __future__ import annotations

import bisect
import operator
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .blockhash import DEFAULT_BLOCK_TOKENS, CacheIdentity, identity_seed, request_identity, salted_seed
from .radix import CacheFullError, RadixNode, RadixTree
from .summary import DEFAULT_HOT_K, DEFAULT_MAX_BLOCKS, BlockIndex, HotPrefix, Summary

_TICK_SAMPLES = 4096
_tick_of = operator.itemgetter(0)
_PRUNE_MIN_EVICTIONS = 1024  # see CacheMirror._prune


@dataclass(frozen=True, slots=True)
class AdapterNamespace:
    """The mirror's namespace of a request hashed under a LoRA adapter (``blockhash.request_identity``):
    its own root per adapter and tenant salt, as the engine keeps an adapter's blocks apart from the
    base model's. Requests under the worker's own identity keep their salt (a str, or None) as the
    namespace, as before adapters."""

    adapter: str
    salt: str | None = None


def namespace_salt(namespace: object) -> str | None:
    """The tenant salt of a mirror namespace (None: unsalted)."""
    if isinstance(namespace, AdapterNamespace):
        return namespace.salt
    return namespace if isinstance(namespace, str) else None


def namespace_adapter(namespace: object) -> str | None:
    """The LoRA adapter a mirror namespace is under; None: the worker's own identity."""
    return namespace.adapter if isinstance(namespace, AdapterNamespace) else None


@dataclass(frozen=True, slots=True)
class Admission:
    """What admitting one sent prompt did to the mirror (for :meth:`CacheMirror.withdraw`)."""

    matched_tokens: int  # of the prompt, already in the mirror before it
    added: RadixNode | None  # the leaf holding the prompt's new tokens; None: nothing was new
    stamp: int  # that leaf's recency right after the insert
    # the tree admitted to: the sidecar replaces its whole mirror when the engine names another cache
    # identity, and a request admitted before that must not take its leaf off the new tree
    tree: RadixTree


class CacheMirror:
    def __init__(
        self,
        capacity_tokens: int,
        identity: CacheIdentity,
        *,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        clock: Callable[[], float],
    ) -> None:
        self.tree = RadixTree(capacity_tokens)
        self.identity = identity
        self.identity_seed = identity.seed()
        self.block_tokens = block_tokens
        self._clock = clock
        self.changes = 0  # bumped on every mutation: a summary is rebuilt only when it moved
        # (tree tick, unix time) samples to turn the tree's logical recency into wall time
        self._ticks: deque[tuple[int, float]] = deque(maxlen=_TICK_SAMPLES)
        self.hot_prefixes: dict[int, HotPrefix] = {}
        # the summary's block hashes, kept as prompts come and go: publishing never walks the tree
        self.index = BlockIndex(self.tree, block_tokens, self.namespace_seed)
        self._pruned_at = self.tree.evictions_total  # the tree's evictions the index has forgotten
        # prediction quality: what the mirror said was cached vs what the engine reported
        self.compared_requests = 0
        self.predicted_tokens_total = 0
        self.reported_tokens_total = 0
        self.overpredicted_tokens_total = 0

    def namespace_seed(self, namespace: object) -> int:
        if isinstance(namespace, AdapterNamespace):
            adapter = CacheIdentity(self.identity.model, self.identity.revision, namespace.adapter)
            return salted_seed(identity_seed(adapter), namespace.salt)
        return salted_seed(self.identity_seed, namespace if isinstance(namespace, str) else None)

    def request_namespace(
        self,
        tenant_salt: str | None,
        adapters: tuple[str, ...],
        engine_api: str,
        model: str | None,
        lora_path: str | None,
    ) -> object:
        """Where a request's prompt goes: ``tenant_salt`` under the worker's own identity, or an
        :class:`AdapterNamespace` when it names a LoRA adapter the engine has loaded, by the rule
        the gateways hash it by (``blockhash.request_identity``), so the summary names its blocks
        as they do."""
        identity = request_identity(self.identity, adapters, engine_api, model, lora_path)
        if identity is self.identity:
            return tenant_salt
        return AdapterNamespace(identity.adapter, tenant_salt)

    def admit(self, token_bytes: bytes, namespace: object) -> int:
        """Record tokens the engine holds (a prompt and its answer); return how many the mirror had."""
        return self.admit_sent(token_bytes, namespace).matched_tokens

    def admit_sent(self, token_bytes: bytes, namespace: object) -> Admission:
        """Record a prompt sent to the engine, before it is prefilled; :meth:`withdraw` takes its new
        tokens back if the request ends before the engine's first token."""
        matched = self.tree.matched_tokens(token_bytes, namespace)
        full_hit = matched * 4 == len(token_bytes)
        added: RadixNode | None = None
        if full_hit:
            # only recency and hits move; the touching match already reaches the prompt's node
            node = self.tree.match_prefix(token_bytes, namespace).node
        else:
            try:
                added_tokens = self.tree.insert(token_bytes, namespace).new_tokens
            except (ValueError, CacheFullError):
                added_tokens = 0  # longer than the whole cache, or pinned: the engine cannot keep it either
            self.changes += 1
            node = self.tree.match_prefix(token_bytes, namespace, touch=False).node
            self.index.track_path(node)
            self._prune()
            if added_tokens:
                added = node  # the insert's new leaf: it ends exactly at the prompt's end
        self.index.touched(node)  # its path's hits and recency rose: the hot ranking looks there
        self._ticks.append((node.last_access, self._clock()))
        return Admission(matched, added, node.last_access, self.tree)

    def _prune(self) -> None:
        """Let the index forget the nodes the tree evicted, once there are many. A summary does
        that too, but a sidecar without Redis never builds one: its index kept every node ever
        evicted (memory growing with every request served). Pruning only when the evictions
        outnumber the tree's nodes keeps the index's scan amortised O(1) per eviction."""
        evicted = self.tree.evictions_total - self._pruned_at
        if evicted > max(_PRUNE_MIN_EVICTIONS, self.tree.node_count):
            self.index.drop_detached()
            self._pruned_at = self.tree.evictions_total

    def withdraw(self, admission: Admission) -> int:
        """Take back the tokens ``admission`` added: its request ended before the engine's first
        token, so the engine may never have prefilled them. Conservative both ways: what the
        engine may hold of a partial prefill is not claimed, and tokens another request has used
        since (matched into, extended, pinned) stay, as that request is prefilling them. Returns
        the tokens removed."""
        if admission.added is None or admission.tree is not self.tree:
            return 0  # nothing added, or added to a mirror this one replaced (that tree is dropped)
        # the tree checks the leaf is still there (not evicted, not flushed) and untouched
        removed = self.tree.remove_leaf(admission.added, if_untouched_since=admission.stamp)
        if removed:
            self.changes += 1
        return removed

    def correct(self, predicted_tokens: int, reported_cached_tokens: int, *, ran_alone: bool) -> int:
        """Reconcile with the engine's report for one request; return tokens evicted from the mirror."""
        self.predicted_tokens_total += predicted_tokens
        self.reported_tokens_total += reported_cached_tokens
        self.overpredicted_tokens_total += max(predicted_tokens - reported_cached_tokens, 0)
        self.compared_requests += 1
        if not ran_alone or reported_cached_tokens >= predicted_tokens:
            return 0
        # Another request's prefill may still have been running when this one arrived; only a
        # request that ran alone is trustworthy evidence that the engine dropped cached tokens.
        missing = predicted_tokens - reported_cached_tokens
        evictable = self.tree.cached_tokens - self.tree.pinned_tokens
        try:
            freed = self.tree.evict(min(missing, evictable)) if evictable > 0 else 0
        except CacheFullError:
            return 0
        if freed:
            self.changes += 1
        return freed

    def flush(self) -> None:
        self.tree.clear()
        self.index.clear()
        self._pruned_at = self.tree.evictions_total
        self.hot_prefixes = {}
        self.changes += 1

    def resize(self, capacity_tokens: int) -> None:
        """Adopt the engine's real capacity (learned after start); shrinking evicts LRU blocks."""
        if capacity_tokens == self.tree.capacity_tokens or capacity_tokens <= 0:
            return
        if self.tree.cached_tokens > capacity_tokens:
            self.tree.evict(self.tree.cached_tokens - capacity_tokens)
        self.tree.capacity_tokens = capacity_tokens
        self.changes += 1

    def wall_time_of(self, tick: int) -> float:
        return self._tick_clock()(tick)

    def _tick_clock(self) -> Callable[[int], float]:
        """A tick -> unix time mapping frozen at this moment (built once per summary). A copy of the
        samples, searched by their tick: no list of the ticks built first (4096 of them at each
        summary, which asks for only its few hot nodes' times)."""
        samples = self._ticks.copy()
        now = self._clock()

        def wall(tick: int) -> float:
            if not samples:
                return now
            i = bisect.bisect_left(samples, tick, key=_tick_of)
            return samples[min(i, len(samples) - 1)][1]

        return wall

    def summary(
        self,
        *,
        worker: str,
        version: int,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        hot_k: int = DEFAULT_HOT_K,
    ) -> Summary:
        summary, hot = self.index.summary(
            worker=worker,
            version=version,
            now=self._clock(),
            identity_seed=self.identity_seed,
            wall_time_of=self._tick_clock(),
            max_blocks=max_blocks,
            hot_k=hot_k,
        )
        self.hot_prefixes = hot
        self._pruned_at = self.tree.evictions_total  # the summary dropped the detached nodes
        return summary
