"""The scheduler model of one emulated engine: pure state machine, no I/O, no clock of its own.

One *iteration* is what a GPU does in one scheduler step, modelled like SGLang:

* **Prefill pass** (serial, FCFS): the request being chunk-prefilled continues first; then waiting
  requests are admitted in arrival order while the pass has budget (``chunk_tokens`` *uncached*
  tokens), fewer than ``max_running`` requests run, and the KV pool can hold them. At admission a
  request's prompt is matched against the radix cache (``cached_tokens`` = longest cached prefix at
  that moment) and inserted with a pin, so a running request's prefix is never evicted; its
  ``max_new_tokens`` are reserved in the pool. Only the unmatched suffix costs prefill time.
  A prompt longer than the remaining budget is chunked over several passes.
* **Decode step**: every request already past prefill produces one token; the step time grows
  mildly with the batch size.

The iteration's modelled duration is the sum of its prefill pass and its decode step, so a long
prefill queue delays decode (and the other way round), as on a real GPU. A request's first token is
emitted at the end of the pass that completes its prefill. When a request finishes, the pin is
released and prompt + generated tokens stay cached (SGLang caches the output too), LRU-evictable.

*When* a prompt counts as cached for other requests is ``EmulatorConfig.cache_on_compute``. False
(the default, optimistic): the whole prompt is inserted, pinned, at admission, so a request admitted
later — even in the same pass, or while the first is still being chunk-prefilled — finds it cached.
True (SGLang-like): admission pins only the matched prefix and reserves pool room for the rest; the
pinned path grows as each pass that computes a chunk completes, so others see only computed tokens.
A waiting request that shares a not-yet-cached prefix with one admitted into the pass being formed
waits for the next pass and finds that prefix cached then (SGLang's in-batch prefix check).

Callers drive it with :meth:`EngineModel.plan` then :meth:`EngineModel.commit` after the
iteration's duration has passed; ``now`` arguments are modelled seconds.
"""

from __future__ import annotations

import contextlib
import enum
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from prefixfleet.router.radix import (
    TOKEN_BYTES,
    CacheFullError,
    RadixTree,
    as_token_bytes,
    common_prefix_bytes,
)

from .config import EmulatorConfig

HIT_RATE_WINDOW = 256  # requests in the cache-hit-rate window
THROUGHPUT_WINDOW_S = 5.0  # modelled seconds in the generation-throughput window
# cache_on_compute: a shared uncached prefix this long makes a request wait for the next pass
# (SGLang's IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD)
BATCH_PREFIX_MIN_TOKENS = 32


def shares_uncached_prefix(prompt: bytes, matched: int, batch: Iterable[bytes]) -> bool:
    """Does ``prompt`` share ``BATCH_PREFIX_MIN_TOKENS`` or more tokens beyond its ``matched`` cached
    ones with a prompt of ``batch`` (those admitted into the prefill pass being formed)? Such a request
    is better off waiting one pass and finding that prefix cached than computing it a second time."""
    need = matched + BATCH_PREFIX_MIN_TOKENS
    if len(prompt) < need * TOKEN_BYTES:
        return False
    return any(common_prefix_bytes(other, prompt) >= need for other in batch)


class RequestState(enum.Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHED = "finished"
    ABORTED = "aborted"


class RequestRejected(ValueError):
    """The request can never run on this engine (e.g. it does not fit in the KV pool)."""


@dataclass(eq=False, slots=True)
class EngineRequest:
    rid: str
    prompt: bytes  # token ids as little-endian uint32 (the radix tree's format)
    max_new_tokens: int
    output: bytes  # the ``max_new_tokens`` token ids this request will generate, same format
    arrival: float
    state: RequestState = RequestState.WAITING
    cached_tokens: int = 0
    computed_tokens: int = 0  # uncached prompt tokens prefilled so far
    pinned: int = 0  # leading prompt tokens in the radix tree under this request's pin
    generated: int = 0
    prefill_started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    # tenant salt (and LoRA adapter, as (adapter, salt)): its own radix root, never shared with others
    namespace: object = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt) // TOKEN_BYTES

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def done(self) -> bool:
        return self.state in (RequestState.FINISHED, RequestState.ABORTED)


@dataclass(frozen=True, slots=True)
class PrefillPart:
    request: EngineRequest
    new_tokens: int  # uncached tokens computed in this pass
    admitted: bool  # True when this pass admitted the request (its cached tokens are looked up now)


@dataclass(frozen=True, slots=True)
class Iteration:
    prefill: tuple[PrefillPart, ...]
    decode: tuple[EngineRequest, ...]
    duration: float  # modelled seconds
    started_at: float


@dataclass(frozen=True, slots=True)
class Progress:
    """What one iteration did for one request."""

    request: EngineRequest
    new_tokens: int  # tokens generated in this iteration (0 or 1)
    first: bool  # prefill completed in this iteration
    finished: bool


@dataclass(slots=True)
class EngineStats:
    num_running: int
    num_waiting: int
    num_used_tokens: int
    token_usage: float
    cached_tokens_in_tree: int
    cache_hit_rate: float
    gen_throughput: float


@dataclass(slots=True)
class _Totals:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    finished_requests: int = 0
    aborted_requests: int = 0
    iterations: int = 0
    hit_window: deque[tuple[int, int]] = field(default_factory=deque)
    hit_window_cached: int = 0
    hit_window_prompt: int = 0
    gen_window: deque[tuple[float, int]] = field(default_factory=deque)


class EngineModel:
    """Queue, KV pool and radix cache of one engine; see the module docstring for the model."""

    def __init__(self, config: EmulatorConfig, block_size: int = 1) -> None:
        """``block_size``: a request's cached tokens are counted in whole blocks of this many tokens
        (vLLM's prefix cache hits full KV blocks only, ``--block-size``, default 16); 1 counts every
        matched token (SGLang's radix cache, page size 1). The tree itself stays token-granular:
        flooring the match to whole blocks is what a block-hash lookup over the same prompts finds."""
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        self.config = config
        self.block_size = block_size
        self.tree = RadixTree(config.cache_tokens)
        self.waiting: deque[EngineRequest] = deque()
        self.prefilling: dict[str, EngineRequest] = {}
        self.decoding: dict[str, EngineRequest] = {}
        self.requests: dict[str, EngineRequest] = {}
        self.chunked: EngineRequest | None = None  # at most one request is part-way through prefill
        self.reserved_decode_tokens = 0
        self.reserved_prefill_tokens = 0  # running requests' prompt tokens not in the tree yet
        self.in_flight: Iteration | None = None
        self.totals = _Totals()

    # -- admission ---------------------------------------------------------------------------

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise :class:`RequestRejected` when such a request could never run here."""
        if prompt_tokens < 1:
            raise RequestRejected("the prompt must contain at least one token")
        if prompt_tokens + max_new_tokens > self.config.cache_tokens:
            raise RequestRejected(
                f"prompt ({prompt_tokens} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                f"KV cache capacity of {self.config.cache_tokens} tokens"
            )

    def submit(self, request: EngineRequest) -> None:
        if request.rid in self.requests:
            raise RequestRejected(f"request id {request.rid!r} is already in use")
        self.check_fits(request.prompt_tokens, request.max_new_tokens)
        if len(request.output) // TOKEN_BYTES < request.max_new_tokens:
            raise ValueError("request.output must hold max_new_tokens token ids")
        request.state = RequestState.WAITING
        self.requests[request.rid] = request
        self.waiting.append(request)

    def abort(self, rid: str) -> bool:
        """Drop a request wherever it is (client went away). Returns False if it is not active."""
        request = self.requests.pop(rid, None)
        if request is None:
            return False
        if request.state is RequestState.WAITING:
            self.waiting.remove(request)
        else:
            self.prefilling.pop(rid, None)
            self.decoding.pop(rid, None)
            if self.chunked is request:
                self.chunked = None
            self._release(request)
        request.state = RequestState.ABORTED
        self.totals.aborted_requests += 1
        return True

    def _unpinned_matched_tokens(self, prompt: bytes, namespace: object = None) -> int:
        """Matched tokens an insert would protect from eviction that no pin protects already."""
        match = self.tree.match_prefix(prompt, namespace, touch=False)
        node, depth, total = match.node, match.depth_in_node, 0
        while node.parent is not None and node.pin_count == 0:  # pins cover whole paths from the root
            total += depth
            node = node.parent
            depth = node.num_tokens
        return total

    def _try_admit(self, request: EngineRequest, now: float) -> bool:
        tree, cap = self.tree, self.config.cache_tokens
        ns = request.namespace
        in_tree = tree.matched_tokens(request.prompt, ns)
        new_tokens = request.prompt_tokens - in_tree  # what inserting the prompt adds to the tree
        # SGLang matches at most the prompt less its last token, which it always computes (the
        # logits of the first output; adjust_max_prefix_ids): an exact repeat reports prompt - 1
        matched = min(in_tree, request.prompt_tokens - 1)
        # vLLM likewise caps a hit at the prompt less one token (kv_cache_manager.py,
        # max_cache_hit_length = num_tokens - 1) and then counts only full blocks of it
        matched -= matched % self.block_size
        reserved = self.reserved_prefill_tokens + self.reserved_decode_tokens + request.max_new_tokens
        need_free = tree.cached_tokens + new_tokens + reserved - cap
        if need_free > 0:
            evictable = (
                tree.cached_tokens - tree.pinned_tokens - self._unpinned_matched_tokens(request.prompt, ns)
            )
            if need_free > evictable:
                return False  # the pool is held by running requests: wait for one to finish
        # cache_on_compute pins only what is cached already; the rest joins the tree as it is computed
        pinned = in_tree if self.config.cache_on_compute else request.prompt_tokens
        key = request.prompt[: pinned * TOKEN_BYTES]
        if pinned:
            try:
                tree.insert(key, ns, pin=True)
            except CacheFullError:
                return False
        excess = tree.cached_tokens + request.prompt_tokens - pinned + reserved - cap
        if excess > 0:
            try:
                tree.evict(excess)
            except CacheFullError:  # not expected after the check above; stay consistent anyway
                if pinned:
                    tree.release_pin(key, ns)
                return False
        self.reserved_decode_tokens += request.max_new_tokens
        self.reserved_prefill_tokens += request.prompt_tokens - pinned
        request.pinned = pinned
        request.cached_tokens = matched
        request.state = RequestState.PREFILLING
        request.prefill_started_at = now
        self.prefilling[request.rid] = request
        return True

    def _cache_computed(self, request: EngineRequest) -> None:
        """Extend the request's pinned path over the prompt tokens computed so far (a no-op when its
        whole prompt was pinned at admission): from now on other requests find them cached."""
        upto = request.cached_tokens + request.computed_tokens
        if upto <= request.pinned:
            return
        try:
            self.tree.insert(request.prompt[: upto * TOKEN_BYTES], request.namespace, pin=True)
        except CacheFullError:  # the pool reservation rules this out; if not, they stay private
            return
        if request.pinned:
            self.tree.release_pin(request.prompt[: request.pinned * TOKEN_BYTES], request.namespace)
        self.reserved_prefill_tokens -= upto - request.pinned
        request.pinned = upto

    def _release(self, request: EngineRequest) -> None:
        """Give back a running request's pool reservation and pin; keep its computed tokens cached."""
        self.reserved_decode_tokens -= request.max_new_tokens
        self.reserved_prefill_tokens -= request.prompt_tokens - request.pinned
        if request.generated > 0:
            sequence = request.prompt + request.output[: request.generated * TOKEN_BYTES]
            # If the output does not fit right now, only the prompt stays cached.
            with contextlib.suppress(CacheFullError, ValueError):
                self.tree.insert(sequence, request.namespace)
        if request.pinned:
            self.tree.release_pin(request.prompt[: request.pinned * TOKEN_BYTES], request.namespace)
        request.pinned = 0

    # -- iterations --------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def idle(self) -> bool:
        return not self.requests

    def plan(self, now: float) -> Iteration | None:
        """Decide the next iteration (admitting requests into prefill); None when there is no work."""
        if self.in_flight is not None:
            raise RuntimeError("commit the iteration in flight before planning another")
        cfg = self.config
        budget = cfg.chunk_tokens
        parts: list[PrefillPart] = []
        if self.chunked is not None:
            request = self.chunked
            take = min(request.uncached_tokens - request.computed_tokens, budget)
            parts.append(PrefillPart(request, take, admitted=False))
            budget -= take
        batch: dict[object, list[bytes]] = {}  # namespace -> prompts admitted into this pass
        deferred: list[EngineRequest] = []
        while budget > 0 and self.waiting and self.num_running < cfg.max_running:
            request = self.waiting[0]
            ns = request.namespace
            if cfg.cache_on_compute and ns in batch:
                matched = self.tree.matched_tokens(request.prompt, ns)
                if shares_uncached_prefix(request.prompt, matched, batch[ns]):
                    deferred.append(self.waiting.popleft())
                    continue
            if not self._try_admit(request, now):
                break  # FCFS: nobody overtakes a request waiting for KV memory
            self.waiting.popleft()
            batch.setdefault(ns, []).append(request.prompt)
            take = min(request.uncached_tokens, budget)
            parts.append(PrefillPart(request, take, admitted=True))
            budget -= take
            if take < request.uncached_tokens:
                self.chunked = request
        self.waiting.extendleft(reversed(deferred))  # first in the queue for the next pass
        decode = tuple(self.decoding.values())
        if not parts and not decode:
            return None
        duration = 0.0
        if parts:
            duration += cfg.prefill_seconds(
                sum(p.new_tokens for p in parts), sum(p.request.cached_tokens for p in parts if p.admitted)
            )
        if decode:
            duration += cfg.decode_seconds(len(decode))
        self.in_flight = Iteration(tuple(parts), decode, duration, now)
        return self.in_flight

    def commit(self, iteration: Iteration, now: float) -> list[Progress]:
        """Apply a planned iteration that has finished at modelled time ``now``."""
        if iteration is not self.in_flight:
            raise RuntimeError("commit must receive the iteration returned by the last plan()")
        self.in_flight = None
        totals = self.totals
        totals.iterations += 1
        out: list[Progress] = []
        generated = 0
        for part in iteration.prefill:
            request = part.request
            if request.done:
                continue
            request.computed_tokens += part.new_tokens
            self._cache_computed(request)
            if request.computed_tokens < request.uncached_tokens:
                continue  # chunked: more passes to go
            if self.chunked is request:
                self.chunked = None
            del self.prefilling[request.rid]
            self._record_prefill(request)
            request.first_token_at = now
            if request.max_new_tokens == 0:  # prefill-only (cache pre-warming)
                out.append(Progress(request, 0, first=True, finished=True))
                self._finish(request, now)
                continue
            request.generated = 1
            generated += 1
            if request.max_new_tokens == 1:
                out.append(Progress(request, 1, first=True, finished=True))
                self._finish(request, now)
            else:
                request.state = RequestState.DECODING
                self.decoding[request.rid] = request
                out.append(Progress(request, 1, first=True, finished=False))
        for request in iteration.decode:
            if request.done:
                continue
            request.generated += 1
            generated += 1
            finished = request.generated >= request.max_new_tokens
            out.append(Progress(request, 1, first=False, finished=finished))
            if finished:
                del self.decoding[request.rid]
                self._finish(request, now)
        totals.generated_tokens += generated
        if generated:
            totals.gen_window.append((now, generated))
        return out

    def _finish(self, request: EngineRequest, now: float) -> None:
        self._release(request)
        request.state = RequestState.FINISHED
        request.finished_at = now
        del self.requests[request.rid]
        self.totals.finished_requests += 1

    def _record_prefill(self, request: EngineRequest) -> None:
        t = self.totals
        t.prompt_tokens += request.prompt_tokens
        t.cached_tokens += request.cached_tokens
        t.hit_window.append((request.cached_tokens, request.prompt_tokens))
        t.hit_window_cached += request.cached_tokens
        t.hit_window_prompt += request.prompt_tokens
        if len(t.hit_window) > HIT_RATE_WINDOW:
            cached, prompt = t.hit_window.popleft()
            t.hit_window_cached -= cached
            t.hit_window_prompt -= prompt

    # -- maintenance & introspection ---------------------------------------------------------

    def flush(self) -> bool:
        """Empty the radix cache; refused (False) while any request is waiting or running."""
        if self.requests:
            return False
        self.tree.clear()
        return True

    def stats(self, now: float) -> EngineStats:
        t = self.totals
        while t.gen_window and t.gen_window[0][0] <= now - THROUGHPUT_WINDOW_S:
            t.gen_window.popleft()
        # SGLang's used = pool - free - evictable. Here running requests hold their pinned prompt
        # path plus the room reserved for them at admission: prompt tokens not yet in the tree
        # (cache_on_compute) and their max_new_tokens, generated or not. Both modes then report the
        # same room for the same requests, and what admission sees as unavailable.
        used = self.tree.pinned_tokens + self.reserved_prefill_tokens + self.reserved_decode_tokens
        return EngineStats(
            num_running=self.num_running,
            num_waiting=len(self.waiting),
            num_used_tokens=used,
            token_usage=used / self.config.cache_tokens,
            cached_tokens_in_tree=self.tree.cached_tokens,
            cache_hit_rate=(t.hit_window_cached / t.hit_window_prompt) if t.hit_window_prompt else 0.0,
            gen_throughput=sum(n for _, n in t.gen_window) / THROUGHPUT_WINDOW_S,
        )


def make_request(
    rid: str, prompt: Iterable[int] | bytes, max_new_tokens: int, output: Iterable[int] | bytes, now: float
) -> EngineRequest:
    """Build a request from token ids (encoding them the way the radix tree stores them)."""
    return EngineRequest(rid, as_token_bytes(prompt), max_new_tokens, as_token_bytes(output), now)


def run_until_idle(model: EngineModel, now: float, max_iterations: int = 1_000_000) -> tuple[float, list]:
    """Drive ``model`` on a virtual clock until no work is left: (end time, [(time, Progress)])."""
    events: list[tuple[float, Progress]] = []
    for _ in range(max_iterations):
        iteration = model.plan(now)
        if iteration is None:
            return now, events
        now += iteration.duration
        events.extend((now, p) for p in model.commit(iteration, now))
    raise RuntimeError(f"model still busy after {max_iterations} iterations")
