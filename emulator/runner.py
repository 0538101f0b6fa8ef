"""The async shell around :class:`EngineModel`: one scheduler loop task per engine, request handles.

The loop plans an iteration, sleeps its modelled duration divided by the time-scale, commits it and
wakes the handles of the requests it advanced. Modelled time is wall time x time-scale, so every
latency the engine reports reads like a real engine's. Short overruns of the event loop are
absorbed (the next iteration is scheduled from the previous deadline) so Python overhead does not
distort ratios at high time-scales.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from array import array
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from prefixfleet.router.radix import as_token_bytes

from .config import EmulatorConfig
from .engine import EngineModel, EngineRequest, EngineStats, Progress, RequestRejected
from .metrics import EngineMetrics, MetricsSink
from .text import completion_text, generated_tokens, generated_words, generation_seed

log = logging.getLogger("prefixfleet.emulator")

CATCHUP_WINDOW_S = 0.005  # wall seconds of overrun still absorbed by deadline scheduling


class EngineStopped(RuntimeError):
    """The engine shut down before the request finished."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Where a request stands; what a response is built from."""

    rid: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    prefilled: bool
    finished: bool
    e2e_latency: float  # modelled seconds since arrival

    @property
    def finish_reason(self) -> str | None:
        return "length" if self.finished else None


class RequestHandle:
    """One submitted request as its HTTP handler sees it."""

    def __init__(
        self, runner: EngineRunner, request: EngineRequest, words: list[str], log_metrics: bool = True
    ) -> None:
        self._runner = runner
        self.request = request
        self.words = words
        # False for health probes: SGLang sends them with log_metrics=False, so its request counters
        # and latency histograms never see them (its scheduler's gauges still do)
        self.log_metrics = log_metrics
        self._changed = asyncio.Event()
        self.error: str | None = None
        self.last_token_at: float | None = None

    @property
    def rid(self) -> str:
        return self.request.rid

    def text(self, tokens: int | None = None, start: int = 0) -> str:
        """Generated text so far (or of tokens ``start..tokens``), with a leading space per word."""
        return completion_text(self.words, self.request.generated if tokens is None else tokens, start)

    def snapshot(self) -> Snapshot:
        r = self.request
        end = r.finished_at if r.finished_at is not None else self._runner.now()
        return Snapshot(
            rid=r.rid,
            prompt_tokens=r.prompt_tokens,
            cached_tokens=r.cached_tokens,
            completion_tokens=r.generated,
            prefilled=r.first_token_at is not None,
            finished=r.finished_at is not None,
            e2e_latency=max(0.0, end - r.arrival),
        )

    def _notify(self) -> None:
        self._changed.set()

    def _fail(self, message: str) -> None:
        self.error = message
        self._changed.set()

    async def updates(self) -> AsyncIterator[Snapshot]:
        """Yield a snapshot whenever the request advanced; the last one is finished (or raises)."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            if self.error is not None:
                raise EngineStopped(self.error)
            snap = self.snapshot()
            yield snap
            if snap.finished:
                return

    async def result(self) -> Snapshot:
        async for snap in self.updates():
            if snap.finished:
                return snap
        raise EngineStopped("request ended without finishing")  # pragma: no cover - defensive

    def abort(self) -> None:
        self._runner.abort(self.rid)


class EngineRunner:
    """Owns one :class:`EngineModel`, its scheduler loop task and the live request handles."""

    def __init__(
        self, config: EmulatorConfig, metrics: MetricsSink | None = None, *, block_size: int = 1
    ) -> None:
        """``metrics``: the API face's series (SGLang's by default); ``block_size``: the granularity
        of cache hits (:class:`EngineModel`)."""
        self.config = config
        self.model = EngineModel(config, block_size)
        self.metrics: MetricsSink = metrics if metrics is not None else EngineMetrics(config.model)
        self._handles: dict[str, RequestHandle] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._t0 = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        # set (and replaced) whenever the scheduler commits an iteration: proof of life for probes
        self._committed = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------------------

    def now(self) -> float:
        """Modelled seconds since start."""
        if self._loop is None:
            return 0.0
        return (self._loop.time() - self._t0) * self.config.time_scale

    async def start(self) -> None:
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._task = asyncio.create_task(self._schedule(), name="emulator-scheduler")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for rid, handle in list(self._handles.items()):
            self.model.abort(rid)
            handle._fail("the engine is shutting down")
        self._handles.clear()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    # -- requests ----------------------------------------------------------------------------

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        self.model.check_fits(prompt_tokens, max_new_tokens)

    def submit(
        self,
        prompt: array | Sequence[int] | bytes,
        max_new_tokens: int,
        rid: str | None = None,
        *,
        namespace: object = None,
        log_metrics: bool = True,
    ) -> RequestHandle:
        """Queue a request. Raises :class:`RequestRejected` when it can never run here."""
        if not self.running:
            raise EngineStopped("the engine is not running")
        encoded = as_token_bytes(prompt)
        words = generated_words(generation_seed(encoded), max_new_tokens)
        output = as_token_bytes(generated_tokens(words))
        request = EngineRequest(
            rid or uuid.uuid4().hex, encoded, max_new_tokens, output, self.now(), namespace=namespace
        )
        if request.rid in self._handles:
            raise RequestRejected(f"request id {request.rid!r} is already in use")
        self.model.submit(request)
        handle = RequestHandle(self, request, words, log_metrics)
        self._handles[request.rid] = handle
        self._wake.set()
        return handle

    def abort(self, rid: str) -> None:
        handle = self._handles.pop(rid, None)
        if self.model.abort(rid) and (handle is None or handle.log_metrics):
            self.metrics.on_aborted()
        if handle is not None:
            handle._fail("aborted")

    def flush(self) -> bool:
        return self.model.flush()

    def next_iteration(self) -> Coroutine[Any, Any, Literal[True]]:
        """Awaitable done once the scheduler commits an iteration (one in flight at this call counts):
        SGLang's health check takes any output of its scheduler after the probe began as alive."""
        return self._committed.wait()  # bound to the current event now, not when first awaited

    def stats(self) -> EngineStats:
        return self.model.stats(self.now())

    def refresh_metrics(self) -> None:
        self.metrics.set_state(self.stats())

    # -- the scheduler loop ------------------------------------------------------------------

    async def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        scale = self.config.time_scale
        deadline = loop.time()
        while True:
            try:
                iteration = self.model.plan(self.now())
            except Exception:  # a bug must not hang every client: fail what is in flight, go on
                log.exception("scheduler plan failed")
                self._fail_all("internal scheduler error")
                continue
            if iteration is None:
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
                continue
            t = loop.time()
            start = deadline if t - deadline < CATCHUP_WINDOW_S else t
            deadline = start + iteration.duration / scale
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            now = self.now()
            try:
                progress = self.model.commit(iteration, now)
            except Exception:
                log.exception("scheduler commit failed")
                self._fail_all("internal scheduler error")
                continue
            committed, self._committed = self._committed, asyncio.Event()
            committed.set()
            self._deliver(progress, now)

    def _fail_all(self, message: str) -> None:
        self.model.in_flight = None
        for rid in list(self._handles):
            handle = self._handles.pop(rid)
            try:
                self.model.abort(rid)
            except Exception:  # pragma: no cover - best effort on an already broken state
                log.exception("abort during recovery failed")
            handle._fail(message)

    def _deliver(self, progress: list[Progress], now: float) -> None:
        metrics = self.metrics
        generated = 0
        for p in progress:
            request = p.request
            handle = self._handles.get(request.rid)
            if handle is None:
                continue
            if not handle.log_metrics:
                if p.finished:
                    self._handles.pop(request.rid, None)
                handle._notify()
                continue
            if p.first:
                metrics.on_prefilled(request.prompt_tokens, request.cached_tokens, now - request.arrival)
            elif handle.last_token_at is not None:
                metrics.on_inter_token(max(0.0, now - handle.last_token_at))
            if p.new_tokens:
                handle.last_token_at = now
                generated += p.new_tokens
            if p.finished:
                self._handles.pop(request.rid, None)
                metrics.on_finished(max(0.0, now - request.arrival))
            handle._notify()
        metrics.on_tokens(generated)
