"""What a sidecar knows of its engine's load, from the requests it forwards (pure state, no I/O).

The engine is modelled as one serial prefill queue (what SGLang and vLLM do for prefill-heavy work):
a request's prefill starts when it arrives or when the previous prefill finished, whichever is
later, and ends at its first byte. That gives a prefill-rate sample per streamed request (tokens /
seconds), smoothed with an EWMA, and an estimate of the prefill backlog: the uncached tokens of the
requests still waiting for their first byte, minus what the engine has drained since the head
request started.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFILL_TOKENS_PER_S = 30000.0
_MIN_SAMPLE_TOKENS = 32
_MIN_SAMPLE_S = 0.0005
_EWMA = 0.2


@dataclass(slots=True)
class _Tracked:
    admitted_at: float
    uncached_tokens: int
    samples_prefill: bool  # streamed (or 1-token) requests time their prefill by their first byte
    first_byte_at: float | None = None
    alone: bool = False  # no other request was in flight when it arrived


class LoadTracker:
    def __init__(self, prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S) -> None:
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self._requests: dict[int, _Tracked] = {}
        self._next_id = 0
        self._last_prefill_end = 0.0
        self.completed = 0
        self.failed = 0

    @property
    def in_flight(self) -> int:
        return len(self._requests)

    @property
    def queued(self) -> int:
        return sum(1 for r in self._requests.values() if r.first_byte_at is None)

    def admit(self, uncached_tokens: int, now: float, *, samples_prefill: bool) -> int:
        """Track a forwarded request; returns its handle."""
        self._next_id += 1
        alone = not self._requests
        self._requests[self._next_id] = _Tracked(now, max(uncached_tokens, 0), samples_prefill, alone=alone)
        return self._next_id

    def ran_alone(self, handle: int) -> bool:
        r = self._requests.get(handle)
        return bool(r and r.alone and len(self._requests) == 1)

    def first_byte(self, handle: int, now: float) -> None:
        r = self._requests.get(handle)
        if r is None or r.first_byte_at is not None:
            return
        r.first_byte_at = now
        started = max(r.admitted_at, self._last_prefill_end)
        self._last_prefill_end = now
        duration = now - started
        if r.samples_prefill and r.uncached_tokens >= _MIN_SAMPLE_TOKENS and duration >= _MIN_SAMPLE_S:
            sample = r.uncached_tokens / duration
            self.prefill_tokens_per_s += _EWMA * (sample - self.prefill_tokens_per_s)

    def finish(self, handle: int, now: float, *, ok: bool = True) -> None:
        r = self._requests.pop(handle, None)
        if r is None:
            return
        if r.first_byte_at is None:
            self._last_prefill_end = max(self._last_prefill_end, now)
        if ok:
            self.completed += 1
        else:
            self.failed += 1

    def pending_prefill_tokens(self, now: float) -> int:
        waiting = [r for r in self._requests.values() if r.first_byte_at is None]
        if not waiting:
            return 0
        backlog = sum(r.uncached_tokens for r in waiting)
        head_start = max(min(r.admitted_at for r in waiting), self._last_prefill_end)
        drained = self.prefill_tokens_per_s * max(now - head_start, 0.0)
        return max(int(backlog - drained), 0)
