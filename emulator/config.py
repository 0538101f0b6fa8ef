"""Configuration of one emulated engine: capacity, speed model and limits (plain, validated data)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

DEFAULT_MODEL = "emulated-llm"


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    """What one emulated engine looks like. Durations are *modelled* seconds (before time-scale).

    Defaults sketch an 8B-class model on one H100: ~30k prefill tok/s, ~20 ms decode steps,
    200k tokens of KV cache, SGLang's chunked-prefill size and running-request cap.
    """

    model: str = DEFAULT_MODEL
    model_revision: str = "main"
    cache_tokens: int = 200_000  # KV pool size in tokens (radix cache + running requests)
    prefill_tokens_per_s: float = 30_000.0  # speed of prefilling *uncached* tokens
    cached_token_cost_s: float = 1.5e-6  # per matched token: a lookup, not a recompute
    prefill_overhead_s: float = 0.010  # fixed cost of one prefill forward pass
    decode_step_s: float = 0.020  # one decode step at batch size 1
    decode_step_per_req_s: float = 0.00015  # growth of a decode step per extra running request
    max_running: int = 64  # SGLang max_running_requests
    chunk_tokens: int = 8192  # SGLang chunked_prefill_size: uncached tokens per prefill forward
    time_scale: float = 1.0  # every modelled duration is divided by this in wall time
    max_prompt_tokens: int | None = None  # None: min(65536, cache_tokens - 1)
    max_new_tokens_limit: int = 16_384
    max_body_bytes: int = 32 * 1024 * 1024
    # False: a prompt counts as cached for other requests from its admission on (optimistic).
    # True: only once the prefill pass computing each chunk has completed, as SGLang inserts a
    # running request's tokens chunk by chunk; a request sharing an uncomputed prefix with one
    # admitted in the same pass waits for the next pass (SGLang's in-batch prefix check).
    cache_on_compute: bool = False
    # SGLang's --enable-cache-report: OpenAI answers carry usage.prompt_tokens_details.cached_tokens
    # (when > 0). Off by default, as in SGLang; /generate's meta_info.cached_tokens is always there.
    enable_cache_report: bool = False
    # None: any token id is accepted (the shared tokenizer's ids are 31-bit CRCs). N: a client's
    # token ids (input_ids, a token-id prompt) must be below N, as a real engine's vocabulary bounds
    # them; text is tokenized as always.
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        if self.max_prompt_tokens is None and isinstance(self.cache_tokens, int):
            object.__setattr__(self, "max_prompt_tokens", max(1, min(65_536, self.cache_tokens - 1)))
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def problems(self) -> list[str]:
        out: list[str] = []
        if not isinstance(self.model, str) or not self.model.strip():
            out.append("model must be a non-empty string")
        if not isinstance(self.model_revision, str) or not self.model_revision.strip():
            out.append("model_revision must be a non-empty string")
        for name in ("cache_tokens", "max_running", "chunk_tokens", "max_prompt_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                out.append(f"{name} must be a positive integer, got {value!r}")
        for name in ("max_new_tokens_limit", "max_body_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                out.append(f"{name} must be a non-negative integer, got {value!r}")
        for name in ("prefill_tokens_per_s", "time_scale"):
            value = getattr(self, name)
            if not _finite(value) or value <= 0:
                out.append(f"{name} must be a positive number, got {value!r}")
        for name in ("cached_token_cost_s", "prefill_overhead_s", "decode_step_s", "decode_step_per_req_s"):
            value = getattr(self, name)
            if not _finite(value) or value < 0:
                out.append(f"{name} must be a non-negative number, got {value!r}")
        vocab = self.vocab_size
        if vocab is not None and (not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1):
            out.append(f"vocab_size must be a positive integer, got {vocab!r}")
        for name in ("cache_on_compute", "enable_cache_report"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                out.append(f"{name} must be true or false, got {value!r}")
        if not out and self.max_prompt_tokens >= self.cache_tokens:
            out.append(
                f"max_prompt_tokens ({self.max_prompt_tokens}) must be smaller than cache_tokens "
                f"({self.cache_tokens}): a prompt and its first output token must fit in the KV cache"
            )
        return out

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def prefill_seconds(self, uncached_tokens: int, cached_tokens: int) -> float:
        """Modelled duration of one prefill forward over these tokens."""
        return (
            self.prefill_overhead_s
            + uncached_tokens / self.prefill_tokens_per_s
            + cached_tokens * self.cached_token_cost_s
        )

    def decode_seconds(self, batch_size: int) -> float:
        """Modelled duration of one decode step producing one token for each of ``batch_size`` requests."""
        return self.decode_step_s + self.decode_step_per_req_s * max(0, batch_size - 1)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
