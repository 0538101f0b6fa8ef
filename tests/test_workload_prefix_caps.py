"""A workload whose shared prefixes could not be built is refused before any work, with one line.

`--set tenants=1e20` (prefixroute, viral, the diurnal scenario), `system_prompts=1e20` (chat) and
`groups=1e7` (gsp, one prompt per group: within the request cap) passed every check: each tenant's
prefix is generated in memory before the first request, so the CLI hung, building gigabytes. The
count is now capped (:data:`MAX_PREFIXES`), and so is count × prefix size (:data:`MAX_PREFIX_TOKENS`),
in every command that takes `--set` (sim, sim-autoscale, up, compare, load).

The hang cases run the real CLI in a subprocess bounded in time and memory (tests/bounded_cli.py):
before the fix they never return.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bounded_cli import run_cli

from prefixfleet.sim import scenarios, workloads
from prefixfleet.sim.workloads import MAX_PREFIX_TOKENS, MAX_PREFIXES, PREFIX_COUNTS, build_workload

SIM = ["sim", "--policies", "round_robin", "--no-progress"]
SCALE = ["sim-autoscale", "--scalers", "uniform", "--no-progress"]


def count_refused(setting: str, value: str, noun: str) -> str:
    """The one line a prefix count past :data:`MAX_PREFIXES` gets (after 'workload W')."""
    return f"setting {setting!r} is too large, got {value!r}; at most {MAX_PREFIXES:,} {noun}"


# (command line, the --set that breaks a cap, the refusal after "prefixfleet COMMAND: error: workload 'W'")
TOO_MANY = [
    ([*SIM, "--workload", "prefixroute"], "tenants=1e20", count_refused("tenants", "1e20", "tenants")),
    ([*SIM, "--workload", "viral"], "tenants=1e20", count_refused("tenants", "1e20", "tenants")),
    ([*SCALE, "--scenario", "diurnal"], "tenants=1e20", count_refused("tenants", "1e20", "tenants")),
    ([*SCALE, "--scenario", "viral"], "tenants=1e20", count_refused("tenants", "1e20", "tenants")),
    (
        [*SIM, "--workload", "chat"],
        "system_prompts=1e20",
        count_refused("system_prompts", "1e20", "system prompts"),
    ),
    # 1e7 requests is within the request cap; 1e7 system prompts of 2048 tokens is 80 GB
    (
        [*SIM, "--workload", "gsp", "--set", "prompts_per_group=1"],
        "groups=1e7",
        count_refused("groups", "1e7", "groups"),
    ),
    # within both caps on their own: 10,000 tenants × 100,000 tokens is 4 GB of prefixes
    (
        [*SIM, "--workload", "prefixroute", "--set", "tenants=10000"],
        "prefix_tokens_max=100000",
        f": 'tenants' × 'prefix_tokens_max' would build 1,000,000,000 prefix tokens; "
        f"at most {MAX_PREFIX_TOKENS:,}",
    ),
    (
        [*SIM, "--workload", "chat", "--set", "system_prompts=1000"],
        "system_prompt_tokens=1e7",
        f": 'system_prompts' × 'system_prompt_tokens' would build 10,000,000,000 prefix tokens; "
        f"at most {MAX_PREFIX_TOKENS:,}",
    ),
]


@pytest.mark.parametrize(
    ("argv", "setting", "refusal"), TOO_MANY, ids=[f"{a[0]} {a[3]} {s}" for a, s, _ in TOO_MANY]
)
def test_too_many_prefixes_is_one_line_not_a_hang(argv: list[str], setting: str, refusal: str) -> None:
    done = run_cli([*argv, "--set", setting])
    kind = "workload" if argv[0] == "sim" else "scenario"
    workload = argv[argv.index(f"--{kind}") + 1]
    separator = "" if refusal.startswith(":") else " "
    line = f"prefixfleet {argv[0]}: error: {kind} {workload!r}{separator}{refusal}\n"
    assert (done.returncode, done.stderr) == (2, line)


def test_the_fleet_commands_refuse_it_before_starting_anything(tmp_path: Path) -> None:
    """up, compare and load take the same --set: refused before a process starts or a request is sent
    (load's target is a port nobody listens on, which it would report after building the workload)."""
    json_path = tmp_path / "compare.json"
    cases = [  # command, workload, its prefix count, the noun the refusal names, the command's own flags
        ("up", "prefixroute", "tenants", "tenants", ["--run-dir", str(tmp_path / "up")]),
        ("compare", "viral", "tenants", "tenants", ["--json", str(json_path), "--run-dir", str(tmp_path)]),
        ("load", "chat", "system_prompts", "system prompts", ["--target", "http://127.0.0.1:9"]),
    ]
    for command, workload, setting, noun, flags in cases:
        done = run_cli([command, "--workload", workload, *flags, "--set", f"{setting}=1e20"])
        line = f"prefixfleet {command}: error: workload {workload!r} {count_refused(setting, '1e20', noun)}"
        assert (done.returncode, done.stderr) == (2, line + "\n")
    assert not json_path.exists()


def test_the_caps_are_exact_and_far_above_what_ships() -> None:
    # at the count cap a workload is built (tiny prefixes keep it fast); one more is refused
    at_cap = build_workload(
        "prefixroute", tenants=MAX_PREFIXES, prefix_tokens_min=1, prefix_tokens_max=1, num_requests=10
    )
    assert len(at_cap.requests) == 10
    with pytest.raises(ValueError, match=f"got {MAX_PREFIXES + 1}; at most {MAX_PREFIXES:,} tenants"):
        build_workload("prefixroute", tenants=MAX_PREFIXES + 1, prefix_tokens_min=1, prefix_tokens_max=1)
    # just over the product cap (1000 × 100,001 tokens) is refused, naming the product
    size = MAX_PREFIX_TOKENS // 1000 + 1
    with pytest.raises(ValueError, match=f"would build {1000 * size:,} prefix tokens"):
        build_workload("prefixroute", tenants=1000, prefix_tokens_min=1, prefix_tokens_max=size)


SHIPPED = {
    "prefixroute": workloads.PREFIXROUTE_DEFAULTS,
    "gsp": workloads.GSP_DEFAULTS,
    "chat": workloads.CHAT_DEFAULTS,
    "viral": workloads.VIRAL_DEFAULTS,
    "viral scenario": scenarios.VIRAL_SCENARIO,
    "diurnal scenario": scenarios.DIURNAL_SCENARIO,
}


@pytest.mark.parametrize("defaults", SHIPPED.values(), ids=SHIPPED.keys())
def test_every_shipped_workload_is_a_hundred_times_within_the_caps(defaults: dict[str, Any]) -> None:
    counted = [(key, size) for key, (_, size) in PREFIX_COUNTS.items() if key in defaults]
    assert counted  # each of these builds shared prefixes from one count setting
    for key, size in counted:
        assert defaults[key] * 100 <= MAX_PREFIXES
        assert defaults[key] * defaults[size] * 100 <= MAX_PREFIX_TOKENS
