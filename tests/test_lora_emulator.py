"""The vLLM emulator's LoRA adapters (pure parts): ``--lora-modules`` as vLLM's LoRAParserAction
reads it, ``/v1/models`` listing each adapter with its parent, ``model`` naming an adapter, a
separate cache per adapter (tests/test_lora_e2e.py drives it over HTTP)."""

from __future__ import annotations

import pytest

from prefixfleet.cli import build_parser
from prefixfleet.emulator.cli import config_from_args, vllm_options_from_args
from prefixfleet.emulator.config import EmulatorConfig
from prefixfleet.emulator.protocol import Call
from prefixfleet.emulator.vllm_api import VllmOptions
from prefixfleet.emulator.vllm_protocol import (
    LoraModule,
    VllmBadRequest,
    check_model,
    model_list,
    parse_lora_module,
)


def test_lora_modules_are_read_as_name_path_or_json():
    assert parse_lora_module("sql=/loras/sql") == LoraModule("sql", "/loras/sql")
    given = '{"name": "sql", "path": "/l", "base_model_name": "m"}'
    assert parse_lora_module(given) == LoraModule("sql", "/l", "m")


@pytest.mark.parametrize(
    ("item", "said"),
    [
        ("a=b=c", "expected name=path"),
        ("=/x", "expected name=path"),
        ("{not json", "Invalid JSON format for --lora-modules"),
        ('{"name": "a"}', "Invalid fields for --lora-modules"),
        ('{"name": "a", "path": "/p", "rank": 8}', "Invalid fields for --lora-modules"),
        ('{"name": "", "path": "/p"}', "name and path must be non-empty strings"),
        ('{"name": "a", "path": "/p", "base_model_name": 3}', "base_model_name must be a string"),
    ],
)
def test_a_bad_lora_module_is_refused_naming_what_is_wrong(item, said):
    with pytest.raises(ValueError, match=said):
        parse_lora_module(item)


def test_the_model_list_gives_each_adapter_its_parent_and_the_base_none():
    loras = (LoraModule("A", "/a"), LoraModule("B", "/b", "other-base"))
    cards = model_list("m", "m", 4096, 0, loras)["data"]
    assert [(c["id"], c["root"], c["parent"], c["max_model_len"]) for c in cards] == [
        ("m", "m", None, 4096),
        ("A", "/a", "m", None),
        ("B", "/b", "other-base", None),
    ]


def test_a_request_naming_an_adapter_is_cached_under_it_and_an_unknown_name_is_a_404():
    loras = (LoraModule("A", "/a"),)
    assert check_model(None, "m", loras) is None and check_model("m", "m", loras) is None
    assert check_model("A", "m", loras) == "A"
    with pytest.raises(VllmBadRequest, match="The model `B` does not exist") as refused:
        check_model("B", "m", loras)
    assert refused.value.status == 404
    call = Call(prompts=(), max_new_tokens=(), rids=(), stream=False, batch=False, cache_salts=("t",))
    assert call.namespace(0) == "t"
    assert Call((), (), (), False, False, adapter="A", cache_salts=("t",)).namespace(0) == ("A", "t")


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (VllmOptions(lora_modules=(LoraModule("A", "/a"),)), "--lora-modules needs --enable-lora"),
        (
            VllmOptions(enable_lora=True, lora_modules=(LoraModule("A", "/a"), LoraModule("A", "/b"))),
            "names an adapter twice",
        ),
        (
            VllmOptions(enable_lora=True, lora_modules=(LoraModule("m", "/a"),)),
            "also the name the engine serves",
        ),
    ],
)
def test_unusable_lora_options_are_refused(options, said):
    problems = options.problems(EmulatorConfig(model="m"))
    assert any(said in p for p in problems), problems


@pytest.mark.parametrize(
    ("value", "on"), [("true", True), ("1", True), ("TRUE ", True), ("0", False), ("", False)]
)
def test_runtime_lora_routes_exist_as_vllm_reads_its_environment(value, on):
    args = build_parser("emulator").parse_args(["emulator", "--port", "0", "--api", "vllm", "--enable-lora"])
    options = vllm_options_from_args(
        args, config_from_args(args), {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": value}
    )
    assert options is not None and options.runtime_lora_updating is on
