"""What a fleet shows when the API server refuses one of its children (pure).

A child the operator writes can pass the fleet's admission and still be refused by the API server:
a replica pod whose ``spec.engine.podTemplate`` mounts a volume the pod lacks (422 Invalid), breaks
a Pod Security or quota policy (403 Forbidden), ... ``kube.ChildRefused`` names the child and the
API server's reason in one line; these functions turn such lines into the fleet's ``Degraded``
condition (reason ``ChildRefused``) and a Warning Event when that changes, so the reason is on the
fleet (``kubectl describe pcf``) instead of only in the operator's log.

The reconcile keeps going past a refused child (the others, the router and the status are still
written) and tries again on its next round; once the API server accepts the child, the planner's
own ``Degraded`` condition replaces this one.

Replica pods share one template, so a refused pod usually means the next would be refused the same
way (a quota, a Pod Security level, an invalid podTemplate): the first refused pod ends the round's
creates (``try_next_create``), rather than N refused calls every round. Except when an admission
webhook refused it: a webhook may judge each pod on its own (by name, by index), so one refused pod
must not hold back the others; the round goes on, and ends at a second refusal (a webhook refusing
every pod then costs two calls a round, not N).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from .planner import PlannedEvent, condition, degraded_event

JSON = dict[str, Any]
REASON = "ChildRefused"
# Kubernetes caps a condition's message at 32768 characters; API server messages can be long.
MAX_MESSAGE = 4096


# kube-apiserver's wording of an admission webhook's denial (whatever status code the webhook chose:
# 400 unless it set one, 403 and 422 are common), e.g.
# 'admission webhook "policy.example.com" denied the request: pod name chat-replica-1 is reserved'
WEBHOOK_DENIAL = re.compile(r'admission webhook "[^"]*" denied the request')


def try_next_create(refused: Sequence[str]) -> bool:
    """After these refused pod creates of a round (the API server's messages, in order), whether to
    try the round's next one: only after a single refusal, by an admission webhook."""
    return len(refused) == 1 and WEBHOOK_DENIAL.search(refused[0]) is not None


def refusal_message(refusals: Sequence[str]) -> str:
    """The condition message: the first refusal in full, then how many more."""
    first = refusals[0][:MAX_MESSAGE]
    more = len(refusals) - 1
    return first + (f" (and {more} more refused)" if more else "")


def with_refusals(
    status: Mapping[str, Any],
    refusals: Sequence[str],
    previous: Sequence[Mapping[str, Any]],
    now: datetime | None = None,
) -> JSON:
    """``status`` (the planner's) with ``Degraded`` set to ``ChildRefused`` when anything was refused.

    ``previous`` are the fleet's current conditions: a Degraded condition that was already True keeps
    its ``lastTransitionTime``, so a refusal repeated every round changes nothing on the fleet."""
    out = dict(status)
    if not refusals:
        return out
    conditions = [dict(c) for c in status.get("conditions") or []]
    planned = next((c for c in conditions if c.get("type") == "Degraded"), None)
    degraded = condition(
        previous,
        "Degraded",
        True,
        REASON,
        refusal_message(refusals),
        now or datetime.now(UTC),
        (planned or status).get("observedGeneration", 0),
    )
    if planned is not None:
        planned.clear()
        planned.update(degraded)
    else:
        conditions.append(degraded)
    out["conditions"] = conditions
    return out


def refusal_events(refusals: Sequence[str], previous: Sequence[Mapping[str, Any]]) -> list[PlannedEvent]:
    """One Warning Event when the refusal the fleet shows starts or changes (planner.degraded_event)."""
    return degraded_event(REASON, refusal_message(refusals), previous) if refusals else []
