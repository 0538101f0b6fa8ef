"""Reading OpenAI usage objects as a client of SGLang (or the emulator) must read them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def cached_tokens(usage: Mapping[str, Any]) -> int:
    """Cached prompt tokens of an engine started with --enable-cache-report: SGLang (and the emulator)
    sends ``prompt_tokens_details`` ``null`` when none were cached (and always without the flag)."""
    details = usage["prompt_tokens_details"]
    return 0 if details is None else details["cached_tokens"]
