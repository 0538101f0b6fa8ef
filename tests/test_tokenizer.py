"""The shared tokenizer as a specification: one token per whitespace-separated word, the same ids at
every hop, a shared text prefix is a shared token prefix, and the chat template is fixed."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixfleet.tokenizer import count_tokens, render_chat, text_for_tokens, tokenize

words = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters=" \t\n\r\x0b\x0c"), min_size=1
)
texts = st.lists(words, max_size=8).map(" ".join)


def test_a_token_is_the_31_bit_crc32_of_a_word_split_on_any_ascii_whitespace():
    ids = tokenize("alpha\tbeta\n\n gamma\r\x0bdelta\x0c")
    assert list(ids) == [zlib.crc32(w.encode()) & 0x7FFFFFFF for w in ("alpha", "beta", "gamma", "delta")]
    assert ids.typecode == "I"
    assert list(tokenize("héllo")) == [zlib.crc32("héllo".encode()) & 0x7FFFFFFF]  # UTF-8 bytes
    assert list(tokenize("   ")) == [] and count_tokens("   ") == 0


def test_a_word_whose_crc_has_the_top_bit_set_still_gets_a_31_bit_id():
    word = next(w for w in (f"w{i}" for i in range(1000)) if zlib.crc32(w.encode()) >= 2**31)
    (token,) = tokenize(word)
    assert token == zlib.crc32(word.encode()) - 2**31


def test_a_lone_surrogate_is_tokenized_not_a_crash():
    assert len(tokenize("a \ud800 b")) == 3 == count_tokens("a \ud800 b")


@settings(max_examples=100, deadline=None)
@given(a=texts, b=texts)
def test_a_shared_text_prefix_is_a_shared_token_prefix(a, b):
    head = tokenize(a)
    joined = tokenize(f"{a} {b}")
    assert joined[: len(head)] == head
    assert len(joined) == count_tokens(f"{a} {b}") == len(head) + count_tokens(b)


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.integers(0, 2**32 - 1), max_size=12))
def test_text_for_tokens_keeps_the_sharing_structure_of_any_ids(ids):
    got = list(tokenize(text_for_tokens(ids)))
    assert len(got) == len(ids)
    for i in range(len(ids)):
        for j in range(len(ids)):
            assert (got[i] == got[j]) == (ids[i] == ids[j])


def test_chat_messages_render_with_the_fixed_template():
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hi"},
                {"type": "image_url"},
                {"type": "text", "text": "there"},
            ],
        },
        {"role": "assistant", "content": None, "tool_calls": []},
    ]
    assert render_chat(messages) == "<|system|> be brief <|user|> hi there <|assistant|>  <|assistant|>"
    assert render_chat([]) == "<|assistant|>"


@pytest.mark.parametrize(
    ("messages", "named"),
    [
        (["text"], r"messages\[0\] must be an object"),
        ([{"role": "user", "content": "a"}, {"content": "b"}], r"messages\[1\]\.role"),
        ([{"role": "user", "content": None}], r"messages\[0\]\.content"),
        ([{"role": "user", "content": 7}], r"messages\[0\]\.content"),
    ],
)
def test_a_bad_message_is_refused_naming_it(messages, named):
    with pytest.raises(ValueError, match=named):
        render_chat(messages)
