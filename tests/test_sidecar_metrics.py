"""The sidecar's own metrics: read from its state at scrape time, appended to the engine's exposition."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from prefixfleet.router.sidecar import Sidecar, SidecarConfig
from prefixfleet.router.sidecar_metrics import exposition, sidecar_registry

ENGINE_TEXT = b"""# HELP sglang:num_queue_reqs Requests waiting to be scheduled.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 3.0"""


def families(text: bytes) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def sidecar() -> Sidecar:
    return Sidecar(SidecarConfig(engine_url="http://127.0.0.1:9", redis_url=None, port=1, worker_id="w0"))


def test_state_is_read_at_scrape_time() -> None:
    sc = sidecar()
    registry = sidecar_registry(lambda: sc.s)
    sc.s.state, sc.s.redis_ok, sc.s.summary_version = "draining", False, 7
    got = families(exposition(None, registry))
    states = {s.labels["state"]: s.value for s in got["prefixfleet_sidecar_state"].samples}
    assert states == {"ready": 0.0, "warming": 0.0, "draining": 1.0}
    assert got["prefixfleet_sidecar_redis_up"].samples[0].value == 0.0
    assert got["prefixfleet_sidecar_summaries_published"].samples[0].value == 7
    assert got["prefixfleet_sidecar_mirror_capacity_tokens"].samples[0].value > 0


def test_engine_metrics_come_first_and_both_parse() -> None:
    sc = sidecar()
    text = exposition(ENGINE_TEXT, sidecar_registry(lambda: sc.s))
    assert text.startswith(ENGINE_TEXT)
    got = families(text)
    assert got["sglang:num_queue_reqs"].samples[0].value == 3.0
    assert "prefixfleet_sidecar_in_flight" in got


def test_no_label_carries_a_prompt_or_hash() -> None:
    sc = sidecar()
    for family in families(exposition(None, sidecar_registry(lambda: sc.s))).values():
        for sample in family.samples:
            assert set(sample.labels) <= {"state", "outcome", "route"}, sample
