"""The emulator's opt-in ``--vocab-size N``: a client's token ids of N or more are refused, as a real
engine refuses ids beyond its vocabulary; text is tokenized as always; without it any id passes.

Parse-level (emulator/protocol.py, emulator/vllm_protocol.py), plus the flag's validation."""

from __future__ import annotations

import pytest

from prefixfleet.cli import UsageError
from prefixfleet.emulator.cli import config_from_args
from prefixfleet.emulator.protocol import BadRequest, Limits, parse_completion, parse_generate
from prefixfleet.emulator.vllm_protocol import CompletionBody, VllmBadRequest, completion_call, validated
from prefixfleet.emulator.vllm_protocol import Limits as VllmLimits


def test_the_sglang_face_refuses_ids_beyond_its_vocabulary_only_when_given_one() -> None:
    bounded = Limits(max_prompt_tokens=100, max_new_tokens=1000, vocab_size=1000)
    with pytest.raises(BadRequest, match=r"greater than the vocab size \(1000\)") as refused:
        parse_generate({"input_ids": [1, 1000]}, bounded)
    assert refused.value.param == "input_ids"
    with pytest.raises(BadRequest, match="vocab size"):
        parse_completion({"prompt": [[1], [5, 2000]]}, bounded)
    assert parse_generate({"input_ids": [0, 999]}, bounded).prompts[0].tolist() == [0, 999]
    assert parse_generate({"text": "words hash far beyond a thousand"}, bounded).prompts  # text: as always
    unbounded = Limits(max_prompt_tokens=100, max_new_tokens=1000)
    assert parse_generate({"input_ids": [2**31]}, unbounded).prompts[0].tolist() == [2**31]


def test_the_vllm_face_refuses_ids_beyond_its_vocabulary_as_vllm_words_it() -> None:
    bounded = VllmLimits(max_model_len=2000, max_prompt_tokens=100, max_new_tokens=1000, vocab_size=1000)
    with pytest.raises(VllmBadRequest, match="Token id 1000 is out of vocabulary"):
        completion_call(validated(CompletionBody, {"prompt": [3, 1000]}), bounded)
    assert completion_call(validated(CompletionBody, {"prompt": "any words at all"}), bounded).prompts


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_vocab_size_below_one_is_refused_naming_the_flag(value: str) -> None:
    import argparse

    from prefixfleet.emulator.cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["emulator", "--port", "0", "--vocab-size", value])
    with pytest.raises(UsageError, match="--vocab-size must be a positive integer"):
        config_from_args(args)
