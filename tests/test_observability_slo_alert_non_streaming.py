"""PrefixfleetAutoscalerAtMaxWithSLOMisses also fires for a fleet whose clients do not stream.

The gateways observe ``prefixfleet_gateway_ttft_seconds`` at the first byte of a *streamed* answer
only (router/gateway.py ``_stream``); a whole (non-streaming) answer leaves the histogram at 0, so a
p90 over it is NaN and a rule on it alone never fires, however slow the fleet. The engines time
every request's first token (their queue included): the rule takes the higher of the two p90s.
Synthetic series, run with ``promtool test rules`` as tests/test_alert_rules.py runs the shipped file.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ALERTS = ROOT / "charts" / "prefixfleet" / "files" / "alerts.yaml"
ALERT = "PrefixfleetAutoscalerAtMaxWithSLOMisses"
MINUTES = 40
BUCKETS = ("0.5", "1", "5", "+Inf")


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def _fleet(fleet: str, engine: str, *, slow: bool, at_max: bool) -> list[dict[str, str]]:
    """A fleet answering whole requests, 10 a minute: the gateway's TTFT buckets stay at 0 (exported
    from the start); the engine's first tokens all come between 1 and 5 s (slow) or under 0.5 s."""
    where = {"namespace": "ns", "fleet": fleet}
    flat, counting = f"0x{MINUTES}", f"0+10x{MINUTES}"
    out = [
        _series("prefixfleet_gateway_ttft_seconds_bucket", {**where, "pod": "g0", "le": le}, flat)
        for le in BUCKETS
    ]
    engine_labels = {**where, "pod": f"{fleet}-0", "model_name": "m"}
    for le in BUCKETS:
        under = float(le) > 1 if slow else True  # cumulative: a slow first token is in le=5 and +Inf
        out.append(
            _series(
                f"{engine}:time_to_first_token_seconds_bucket",
                {**engine_labels, "le": le},
                counting if under else flat,
            )
        )
    out += [
        _series("prefixfleet_operator_target_ttft_seconds", where, f"1x{MINUTES}"),
        _series("prefixfleet_operator_replicas", where, f"{4 if at_max else 2}x{MINUTES}"),
        _series("prefixfleet_operator_max_replicas", where, f"4x{MINUTES}"),
    ]
    return out


def _promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        pytest.fail("promtool is not on PATH: install Debian's prometheus package (.ci/run does this)")
    return found


def test_a_slow_fleet_at_max_alerts_though_its_clients_do_not_stream(tmp_path: Path) -> None:
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)  # promtool compares annotations verbatim
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(rules))
    series = [
        *_fleet("sglang-slow", "sglang", slow=True, at_max=True),
        *_fleet("vllm-slow", "vllm", slow=True, at_max=True),
        *_fleet("fast", "sglang", slow=False, at_max=True),  # at max but within its target
        *_fleet("room", "sglang", slow=True, at_max=False),  # slow, but the autoscaler can still add
    ]
    fired = [
        {"exp_labels": {"severity": "critical", "namespace": "ns", "fleet": f}}
        for f in ("sglang-slow", "vllm-slow")
    ]
    test = {
        "rule_files": ["alerts.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": ALERT, "exp_alerts": []},  # not yet for 15m
                    {"eval_time": "30m", "alertname": ALERT, "exp_alerts": fired},
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    result = subprocess.run(
        [_promtool(), "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
