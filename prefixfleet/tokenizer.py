"""A deterministic, dependency-free tokenizer shared by the emulator, sidecar, gateway and load generator.

Real engines use the model's tokenizer; what routing needs is only that every hop sees the same token
sequence for the same text and that a shared text prefix is a shared token prefix. Word-level
splitting gives both: one token per whitespace-separated word, id = CRC-32 of the word (31 bits).
Synthetic workloads turn token ids back into words with :func:`text_for_tokens`.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterable, Mapping, Sequence


def tokenize(text: str) -> array:
    """Token ids of ``text`` as ``array('I')``."""
    # bytes.split() splits on ASCII whitespace, twice as fast as a regex and the same words
    data = text.encode("utf-8", "surrogatepass")
    return array("I", [zlib.crc32(w) & 0x7FFFFFFF for w in data.split()])


def count_tokens(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass").split())


def text_for_tokens(tokens: Iterable[int]) -> str:
    """Text whose tokenization has the same sharing structure as ``tokens`` (one word per id)."""
    return " ".join(f"t{t:x}" for t in tokens)


def render_chat(messages: Sequence[Mapping[str, object]]) -> str:
    """Flatten OpenAI chat messages to the prompt text the engine prefills (a fixed template).

    Raises ``ValueError`` naming the bad message when a message lacks a string role/content. A
    message other than the user's may have no content (null or absent), as OpenAI allows beside
    ``tool_calls``; its role is rendered lower-cased. The gateway, the sidecar and the emulator all
    render through here, so they agree on the prompt's tokens.
    """
    parts: list[str] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise ValueError(f"messages[{i}] must be an object")
        role, content = msg.get("role"), msg.get("content")
        if not isinstance(role, str):
            raise ValueError(f"messages[{i}].role must be a string")
        if role != "user":
            # as SGLang's request models do: every role but user is lower-cased ("System" is the
            # same prompt, so the same cache), and its content is optional (a tool-calling turn)
            role = role.lower()
            if content is None:
                content = ""
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            content = " ".join(
                str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text"
            )
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string or a list of text parts")
        parts.append(f"<|{role}|> {content}")
    parts.append("<|assistant|>")
    return " ".join(parts)
