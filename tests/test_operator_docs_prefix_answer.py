"""docs/autoscaling-operator.md names every field of a sidecar's prefix answer, LoRA's included.

``GET /prefixfleet/prefix/{hash}`` (``router/prewarm.py`` ``handle_prefix``) gained ``lora_adapter``
when LoRA adapters became part of the cache identity, and a warm-up refuses a prefix cached under an
adapter the target's engine has not loaded; the page described neither, so a user reading why a
warm-up failed ("the prefix is cached under LoRA adapter ...") found nothing there. The fields are
read from the handler's source, so a field added later without the page fails here too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "autoscaling-operator.md"
PREWARM = ROOT / "router" / "prewarm.py"


def answer_fields() -> list[str]:
    """The keys of the JSON object ``handle_prefix`` answers with."""
    (handler,) = [
        node
        for node in ast.walk(ast.parse(PREWARM.read_text()))
        if isinstance(node, ast.AsyncFunctionDef) and node.name == "handle_prefix"
    ]
    (answer,) = [
        node
        for node in ast.walk(handler)
        if isinstance(node, ast.Dict)
        and any(isinstance(k, ast.Constant) and k.value == "hash" for k in node.keys)
    ]
    return [k.value for k in answer.keys if isinstance(k, ast.Constant)]


def bullet(start: str) -> str:
    text = DOC.read_text()
    begin = text.index(start)
    end = text.find("\n* ", begin + 1)
    return text[begin:end]


def test_the_prefix_answer_fields_are_each_named() -> None:
    fields = answer_fields()
    assert "lora_adapter" in fields  # the handler still answers it
    described = bullet("* `GET /prefixfleet/prefix/{hash}`")
    assert [f for f in fields if f"`{f}`" not in described] == []


def test_the_lora_refusal_of_a_warm_up_is_described_as_the_sidecar_words_it() -> None:
    source = PREWARM.read_text()
    words = "which this replica's engine has not loaded"
    assert words in source
    described = " ".join(bullet("* `POST /prefixfleet/warm").split())
    assert re.search(r"`lora_adapter` this replica's\s+engine has not loaded", described)
    assert words in described
