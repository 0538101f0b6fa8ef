"""``--engine KEY=VALUE`` numbers are held to ServiceConfig's own rules, said in its own words.

The CLI restated two of them (counts positive, float fields >= 0) to add the flag and the typed
text to the line; a rule changed in ``sim/engine.py`` alone then never reached ``--engine``. Now
ServiceConfig refuses with the field and the rule apart (:class:`FieldRuleError`) and the CLI only
adds ``--engine`` and what was typed.
"""

from __future__ import annotations

from dataclasses import fields

import pytest

import prefixfleet.sim.engine as engine
from prefixfleet.cli import main
from prefixfleet.sim.engine import FieldRuleError, ServiceConfig

SIM = ["sim", "--policies", "round_robin", "--no-progress", "--workload", "chat", "--service", "batched"]
NUMERIC = [f.name for f in fields(ServiceConfig) if f.type in ("int", "float")]


@pytest.mark.parametrize("field", NUMERIC)
def test_every_numeric_field_is_refused_on_the_command_line_as_serviceconfig_words_it(
    field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # the library's refusal: field, rule and the value it was given, whichever field it is
    with pytest.raises(FieldRuleError) as refused:
        ServiceConfig(service="batched", **{field: -1})
    assert (refused.value.field, str(refused.value)) == (field, f"{field} {refused.value.rule}, got -1")
    # the command line's: the same rule, with the flag and the text as typed
    assert main([*SIM, "--engine", f"{field}=-1e0"]) == 2
    line = f"--engine {field} {refused.value.rule}, got '-1e0'"
    assert capsys.readouterr().err == f"prefixfleet sim: error: {line}\n"


def test_a_rule_changed_in_engine_alone_reaches_the_engine_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # were decode_base_s a count-like "positive" field, 0 would be refused in those words
    floor = engine.field_floor
    monkeypatch.setattr(
        engine, "field_floor", lambda name: "positive" if name == "decode_base_s" else floor(name)
    )
    assert main([*SIM, "--engine", "decode_base_s=0.0"]) == 2
    line = "--engine decode_base_s must be positive, got '0.0'"
    assert capsys.readouterr().err == f"prefixfleet sim: error: {line}\n"


def test_a_recommended_value_is_refused_without_a_flag() -> None:
    # nothing typed: the library's line as it is (no --engine to name)
    with pytest.raises(ValueError, match=r"^step_token_budget must be positive, got 0$"):
        ServiceConfig(service="batched", step_token_budget=0)
