"""The CRD's CEL rules must pass the API server's static cost estimate, or the CRD is refused.

Kubernetes estimates every ``x-kubernetes-validations`` rule's worst-case cost when the CRD is
written and refuses the whole CRD (``estimated rule cost exceeds budget by factor of more than
100x``) over the limit. cel-go's estimator gives ``string(<int>)`` no size (a conversion's result
has no schema path, and a string is no fixed-size scalar), so a string concatenation with it is
costed at its result's size, unbounded: kubernetes/kubernetes#124234 shows a CRD refused for
``'invalid attempts: ' + string(self.attempts)``. 116dbe8's blockTokens rule compared each engine
arg with ``'--block-size=' + string(self.router.blockTokens)``, so a real API server refused the
regenerated CRD (install and upgrade). Equality of an arg (bounded by maxLength) with ``string(x)``
is fine: its cost is the smaller operand's size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import celpy
from lark import Token, Tree

from prefixfleet.operator import models
from prefixfleet.operator.crd import build_crd
from tests.test_crd_cel import api_server_refusals, fleet, model_refusal

ENV = celpy.Environment()


def rules(node: Any) -> Iterator[dict[str, str]]:
    if isinstance(node, dict):
        yield from node.get("x-kubernetes-validations", [])
        for value in node.values():
            yield from rules(value)
    elif isinstance(node, list):
        for value in node:
            yield from rules(value)


def _is_string_conversion(node: Tree) -> bool:
    # down the single-child chain (addition > multiplication > unary > member > primary) to a call
    while isinstance(node, Tree):
        if node.data == "ident_arg":
            name = node.children[0]
            return isinstance(name, Token) and str(name) == "string"
        present = [c for c in node.children if c is not None]
        if len(present) != 1:
            return False
        node = present[0]
    return False


def concatenations_of_a_conversion(expression: str) -> list[str]:
    """The ``a + string(b)`` (or ``string(a) + b``) sums in ``expression``, as text."""
    found = []
    for node in ENV.compile(expression).iter_subtrees():
        if node.data != "addition" or not node.children or not isinstance(node.children[0], Tree):
            continue
        head = node.children[0]
        if head.data != "addition_add":
            continue
        operands = [head.children[0], node.children[1]]
        if any(isinstance(o, Tree) and _is_string_conversion(o) for o in operands):
            found.append(str(node)[:120])
    return found


def test_no_rule_concatenates_a_string_conversion_whose_cost_the_api_server_cannot_bound() -> None:
    # a messageExpression is costed too, against the same budget (#124234's was one)
    offending = {
        expression[:80]: found
        for rule in rules(build_crd())
        for expression in (rule["rule"], rule.get("messageExpression", ""))
        if expression and (found := concatenations_of_a_conversion(expression))
    }
    assert offending == {}


def test_the_detector_finds_the_pattern_kubernetes_refused() -> None:
    # kubernetes/kubernetes#124234's expression, and the comparison that costs little
    assert concatenations_of_a_conversion("'invalid attempts: ' + string(self.attempts)")
    assert not concatenations_of_a_conversion("self.args[0] == string(self.n)")


def spec(args: list[str], block_tokens: int) -> dict[str, Any]:
    engine = {"kind": "vllm", "args": args}
    return {"model": {"name": "m"}, "engine": engine, "router": {"blockTokens": block_tokens}}


def test_the_valued_form_is_still_checked_by_the_rule_both_spellings() -> None:
    for flag in models.BLOCK_SIZE_FLAGS:
        for args, bt, refused in (
            ([f"{flag}=32"], 32, False),
            ([f"{flag}=32"], 16, True),
            (["--tp", "2", f"{flag}=8"], 8, False),
            ([f"{flag}=8", "--tp", "2"], 80, True),
        ):
            refusals = api_server_refusals(fleet(spec(args, bt)))
            assert bool(refusals) == refused, (args, bt, refusals)
            assert (model_refusal(spec(args, bt)) is not None) == refused
