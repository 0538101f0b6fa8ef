"""A gateway's routable workers for a request naming a model (pure: FleetView fed records by hand).

Specification:
* the model is matched among the live, ready workers before suspects (workers that just failed or
  refused) are set aside: when the only worker serving a model is a suspect, it is still the one
  routable for that model, never another model's worker;
* a request naming no model, or a model nobody lists, sees the routable set as before: fresh
  workers, suspects only when nothing else is left.
"""

from __future__ import annotations

from prefixfleet.router.records import LoadReport, MemberRecord, encode_record
from prefixfleet.router.view import SUSPECT_S, FleetView


def member(model: str) -> str:
    return encode_record(MemberRecord(url="http://127.0.0.1:9", served_models=(model,)))


def load() -> str:
    return encode_record(
        LoadReport(
            seq=1, ts=0.0, state="ready", engine_ok=True, in_flight=0, queued=0, pending_prefill_tokens=0,
            prefill_tokens_per_s=1000.0, cached_tokens=0, capacity_tokens=100, summary_version=0,
        )
    )  # fmt: skip


def view_with_a_failed() -> FleetView:
    view = FleetView()
    view.apply_snapshot({"a": member("model-a"), "b": member("model-b")}, {"a": load(), "b": load()}, 0.0)
    view.mark_failed("a", 0.0)
    return view


def ids(workers: list) -> list[str]:
    return sorted(w.worker_id for w in workers)


def test_the_only_worker_serving_a_model_stays_its_route_while_suspect() -> None:
    view = view_with_a_failed()
    assert ids(view.routable(0.1, "model-a")) == ["a"]
    assert ids(view.routable(0.1, "model-b")) == ["b"]


def test_requests_naming_no_known_model_see_the_fresh_workers_as_before() -> None:
    view = view_with_a_failed()
    assert ids(view.routable(0.1)) == ["b"]
    assert ids(view.routable(0.1, "default")) == ["b"]
    assert ids(view.routable(SUSPECT_S + 0.1, "default")) == ["a", "b"]  # a served its time out
