"""What a sidecar knows of its engine's load, from the requests it forwards (pure state, no I/O).

*Prefill rate* is measured over busy periods, not per request: engines prefill several requests in
one forward pass (chunked prefill), so per-request "time since the previous first byte" is
meaningless (two requests finishing in one pass would claim an infinite rate). Instead the tracker
adds up the uncached tokens of timed requests whose first byte arrived and the wall time during which
at least one timed request was waiting for its first byte, and folds their ratio into an EWMA once
enough of both accumulated. Timed requests are streamed ones (first byte = end of prefill) and
1-token ones; a non-streamed answer arrives only after decoding and would understate the rate.

*Pending prefill tokens*: the uncached tokens of timed requests still waiting for their first byte,
plus, for untimed ones, their uncached tokens minus what the engine drained at the measured rate
since they arrived.

*Fixed latency*: the engine's per-step costs (the step in progress, the fixed part of a prefill
pass) that no token count explains; a router adds it to every replica's estimated wait, as the
simulator's batched model does. Timed requests that found no prefill queued ahead of them give
clean pairs (uncached tokens, time to first byte) = fixed latency + tokens / rate. An
exponentially weighted least-squares line through those pairs gives both numbers once their sizes
spread enough (a mix of hits and misses); its slope then also replaces the busy-period rate, which
counts the fixed costs as prefill time and, on a stream of mostly cache hits, reads a fraction of
the real rate (then ``pending / rate`` inflates every queue). Until then the fixed latency is the
EWMA of what the busy-period rate leaves unexplained.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFILL_TOKENS_PER_S = 30000.0
_SAMPLE_MIN_TOKENS = 256  # fold a sample in once this much prefill work finished...
_SAMPLE_MIN_S = 0.02  # ...over at least this much busy time
_EWMA = 0.3
_FIT_DECAY = 0.03  # weight of each new pair in the latency line (a memory of ~30 requests)
_FIT_MIN_SPREAD = 64.0  # tokens: below this spread of sizes the line's slope is noise
_FIT_MIN_WEIGHT = 8.0  # pairs (decayed) before the line is trusted


class _LatencyLine:
    """Exponentially weighted least squares of time to first byte on uncached tokens."""

    __slots__ = ("w", "x", "xx", "xy", "y")

    def __init__(self) -> None:
        self.w = self.x = self.y = self.xx = self.xy = 0.0

    def add(self, tokens: float, seconds: float) -> None:
        keep = 1.0 - _FIT_DECAY
        self.w = self.w * keep + 1.0
        self.x = self.x * keep + tokens
        self.y = self.y * keep + seconds
        self.xx = self.xx * keep + tokens * tokens
        self.xy = self.xy * keep + tokens * seconds

    def fit(self) -> tuple[float, float] | None:
        """(seconds per token, fixed seconds) when identifiable, else None."""
        if self.w < _FIT_MIN_WEIGHT:
            return None
        mx, my = self.x / self.w, self.y / self.w
        var = self.xx / self.w - mx * mx
        if var < _FIT_MIN_SPREAD**2:
            return None
        slope = (self.xy / self.w - mx * my) / var
        if slope <= 0:
            return None
        return slope, max(my - slope * mx, 0.0)


@dataclass(slots=True)
class _Tracked:
    admitted_at: float
    uncached_tokens: int
    timed: bool  # its first byte marks the end of its prefill
    first_byte_at: float | None = None
    alone: bool = False  # no other request was in flight when it arrived
    unqueued: bool = False  # timed, and no other timed request was waiting for its first byte
    reported_uncached: int | None = None  # the engine's own figure, once its answer told us


class LoadTracker:
    def __init__(self, prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S) -> None:
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self._requests: dict[int, _Tracked] = {}
        self._next_id = 0
        self._timed_waiting = 0
        self._busy_since: float | None = None
        self._busy_s = 0.0
        self._done_tokens = 0
        self.samples = 0
        self.fixed_latency_s = 0.0
        self.latency_samples = 0
        self.fitted = False  # the latency line (not busy periods) sets the rate
        self._line = _LatencyLine()
        self.completed = 0
        self.failed = 0

    @property
    def in_flight(self) -> int:
        return len(self._requests)

    @property
    def queued(self) -> int:
        return sum(1 for r in self._requests.values() if r.first_byte_at is None)

    # -- busy-period accounting ------------------------------------------------------------------

    def _busy_start(self, now: float) -> None:
        if self._timed_waiting == 0:
            self._busy_since = now
        self._timed_waiting += 1

    def _busy_stop(self, now: float) -> None:
        self._timed_waiting -= 1
        if self._timed_waiting == 0 and self._busy_since is not None:
            self._busy_s += max(now - self._busy_since, 0.0)
            self._busy_since = None

    def _maybe_sample(self, now: float) -> None:
        busy = self._busy_s + (now - self._busy_since if self._busy_since is not None else 0.0)
        if self._done_tokens >= _SAMPLE_MIN_TOKENS and busy >= _SAMPLE_MIN_S:
            sample = self._done_tokens / busy
            if not self.fitted:
                self.prefill_tokens_per_s += _EWMA * (sample - self.prefill_tokens_per_s)
            self.samples += 1
            self._done_tokens = 0
            self._busy_s = 0.0
            if self._busy_since is not None:
                self._busy_since = now

    # -- request lifecycle -----------------------------------------------------------------------

    def admit(self, uncached_tokens: int, now: float, *, timed: bool) -> int:
        """Track a forwarded request; returns its handle."""
        self._next_id += 1
        alone = not self._requests
        unqueued = timed and self._timed_waiting == 0
        self._requests[self._next_id] = _Tracked(
            now, max(uncached_tokens, 0), timed, alone=alone, unqueued=unqueued
        )
        if timed:
            self._busy_start(now)
        return self._next_id

    def ran_alone(self, handle: int) -> bool:
        r = self._requests.get(handle)
        return bool(r and r.alone and len(self._requests) == 1)

    def first_byte(self, handle: int, now: float) -> None:
        r = self._requests.get(handle)
        if r is None or r.first_byte_at is not None:
            return
        r.first_byte_at = now
        if r.timed:
            self._busy_stop(now)

    def report_uncached(self, handle: int, uncached_tokens: int) -> None:
        """The engine's answer said how much it prefilled (prompt − cached tokens): it beats the
        mirror's prediction for the rate sample (e.g. after a sidecar restart the mirror is empty)."""
        r = self._requests.get(handle)
        if r is not None:
            r.reported_uncached = max(uncached_tokens, 0)

    def finish(self, handle: int, now: float, *, ok: bool = True) -> None:
        r = self._requests.pop(handle, None)
        if r is None:
            return
        if r.timed:
            if r.first_byte_at is None:
                self._busy_stop(now)  # failed before its first byte: no sample from it
            elif ok:
                done = r.uncached_tokens if r.reported_uncached is None else r.reported_uncached
                self._done_tokens += done
                self._maybe_sample(now)
                if r.unqueued:
                    self._learn_latency(done, r.first_byte_at - r.admitted_at)
        if ok:
            self.completed += 1
        else:
            self.failed += 1

    def _learn_latency(self, uncached_tokens: int, ttft_s: float) -> None:
        self._line.add(uncached_tokens, ttft_s)
        self.latency_samples += 1
        line = self._line.fit()
        if line is not None:
            self.fitted = True
            self.prefill_tokens_per_s = 1.0 / line[0]
            self.fixed_latency_s = line[1]
            return
        sample = max(ttft_s - uncached_tokens / self.prefill_tokens_per_s, 0.0)
        weight = 1.0 if self.latency_samples == 1 else _EWMA
        self.fixed_latency_s += weight * (sample - self.fixed_latency_s)

    def pending_prefill_tokens(self, now: float) -> int:
        timed = 0
        untimed = 0.0
        for r in self._requests.values():
            if r.first_byte_at is not None:
                continue
            if r.timed:
                timed += r.uncached_tokens
            else:
                drained = self.prefill_tokens_per_s * max(now - r.admitted_at, 0.0)
                untimed += max(r.uncached_tokens - drained, 0.0)
        return timed + int(untimed)
