"""spec.engine.replaceUnreadyAfterSeconds / replaceNeverReadyAfterSeconds at admission: the models
and the CRD refuse the same values, naming the field (a negative allowance, more than a day, a
fraction, text); 0 (never), the defaults and the bounds are accepted, and the CRD fills the same
defaults. (A numeric string such as "120" is refused by the CRD but coerced by the models, as for
every integer field of the spec: the API server refuses it before the operator sees it.)"""

from __future__ import annotations

from typing import Any

import pytest

from prefixfleet.operator import models
from prefixfleet.operator.crd import build_crd
from prefixfleet.operator.crd_admission import admission_errors, apply_defaults, crd_schema

KNOBS = ("replaceUnreadyAfterSeconds", "replaceNeverReadyAfterSeconds")


def fleet(**engine: Any) -> dict[str, Any]:
    return {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": "f", "namespace": "default"},
        "spec": {"model": {"name": "m"}, "engine": {"kind": "emulator", **engine}},
    }


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return build_crd()


@pytest.mark.parametrize("knob", KNOBS)
@pytest.mark.parametrize("value", [-1, 86401, 1.5, "two minutes"])
def test_a_nonsense_allowance_is_refused_by_both_naming_the_field(
    knob: str, value: object, crd: dict[str, Any]
) -> None:
    problems = admission_errors(crd, fleet(**{knob: value}))
    assert any(knob in p for p in problems), problems
    with pytest.raises(models.InvalidFleetSpec) as err:
        models.validate_spec(fleet(**{knob: value})["spec"])
    assert f"spec.engine.{knob}" in str(err.value)


@pytest.mark.parametrize("knob", KNOBS)
@pytest.mark.parametrize("value", [0, 1, 86400])
def test_never_and_the_bounds_are_accepted_by_both(knob: str, value: int, crd: dict[str, Any]) -> None:
    assert admission_errors(crd, fleet(**{knob: value})) == []
    engine = models.validate_spec(fleet(**{knob: value})["spec"]).engine
    assert engine.model_dump(by_alias=True)[knob] == value


def test_the_crd_fills_the_models_defaults(crd: dict[str, Any]) -> None:
    defaulted = apply_defaults(crd_schema(crd), fleet())["spec"]["engine"]
    engine = models.validate_spec(fleet()["spec"]).engine
    assert [defaulted[k] for k in KNOBS] == [120, 0]
    assert (engine.replace_unready_after_seconds, engine.replace_never_ready_after_seconds) == (120, 0)
