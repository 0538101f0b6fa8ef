"""A vLLM fleet stored under the CRD before 116dbe8 holds ``blockTokens: 16``: that CRD's default,
written by the API server though the user's manifest never set it. With ``--block-size 32`` in its
args it is refused after the upgrade, by the operator (InvalidSpec) and at every later ``kubectl
apply`` (the CEL rule runs on the merged object, and an apply removes only fields the last applied
manifest had, so the stored 16 stays). "Leave blockTokens out", all the refusal said, is what that
user's manifest already does: the refusal must say how to remove the stored value."""

from __future__ import annotations

from typing import Any

from tests.test_crd_cel import api_server_refusals, fleet, model_refusal

REMOVE = '"op": "remove", "path": "/spec/router/blockTokens"'


def stored_under_the_old_crd() -> dict[str, Any]:
    return {
        "model": {"name": "m"},
        "engine": {"kind": "vllm", "args": ["--block-size", "32"]},
        "router": {"blockTokens": 16},  # the old CRD's default, never in the user's manifest
    }


def test_the_operators_refusal_says_how_to_remove_the_stored_default() -> None:
    refusal = model_refusal(stored_under_the_old_crd())
    assert refusal is not None and "spec.router.blockTokens (16)" in refusal
    assert REMOVE in refusal, refusal


def test_the_api_servers_refusal_says_how_to_remove_the_stored_default() -> None:
    refusals = api_server_refusals(fleet(stored_under_the_old_crd()))
    assert [rule["fieldPath"] for _path, rule, _self in refusals] == [".router.blockTokens"]
    assert REMOVE in refusals[0][1]["message"]
