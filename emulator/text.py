"""Deterministic generated text: one word per output token, derived from the prompt.

A real engine decoding greedily returns the same continuation for the same prompt; so does this.
Each word is one token under :mod:`prefixfleet.tokenizer`, so a client that appends the answer to
the conversation produces exactly the token sequence the engine cached after generating it.
"""

from __future__ import annotations

import hashlib
import random
from array import array

from prefixfleet.tokenizer import tokenize

# Plain lowercase words (no punctuation): each is exactly one whitespace-separated token.
_WORDS = """
the a of and to in is that it for on with as was by at be this from or an are have not
which but all they one had there can were when their more will would about if out so up what
into than them some time could only other then these two may first after also new any way
well because most over such where through long right even much must still before
cache prefix token model router replica fleet queue prefill decode batch tree node request
"""
VOCABULARY: tuple[str, ...] = tuple(_WORDS.split())


def generation_seed(prompt_tokens: bytes) -> bytes:
    """A short stable digest of the prompt: same prompt, same continuation, on every engine."""
    return hashlib.blake2b(prompt_tokens, digest_size=16).digest()


def generated_words(seed: bytes, count: int) -> list[str]:
    """``count`` words determined by ``seed``."""
    if count <= 0:
        return []
    return random.Random(seed).choices(VOCABULARY, k=count)


def generated_tokens(words: list[str]) -> array:
    """Token ids of the generated words, exactly as the shared tokenizer would produce them."""
    return tokenize(" ".join(words))


def completion_text(words: list[str], count: int, start: int = 0) -> str:
    """Text of generated tokens ``start..count`` as a raw continuation (a leading space per word)."""
    return "".join(" " + w for w in words[start:count])
