"""``prefixfleet emulator-bench`` refuses an output length its emulators refuse, and prints a run
whose requests all failed without a traceback.

Before, ``--max-new-tokens 100000`` (over the emulator's default --max-new-tokens-limit, 16384) ran
the whole benchmark with every request refused (400), then died formatting the table: ``TypeError:
unsupported format string passed to NoneType.__format__``.
"""

from __future__ import annotations

import pytest

from prefixfleet.cli import UsageError, build_parser
from prefixfleet.emulator import bench
from prefixfleet.emulator.config import EmulatorConfig


def test_an_output_length_the_emulator_refuses_is_one_line_before_the_run():
    limit = EmulatorConfig().max_new_tokens_limit
    args = build_parser("emulator-bench").parse_args(["emulator-bench", "--max-new-tokens", str(limit + 1)])
    with pytest.raises(UsageError, match=rf"--max-new-tokens must be at most {limit} .*got {limit + 1}"):
        bench.run(args)


def test_a_run_with_no_latency_is_printed_as_dashes():
    failed = {
        "time_scale": 1.0, "requests": 3, "concurrency": 1, "max_new_tokens": 1, "errors": 3,
        "requests_per_s": 0.0, "wall_e2e_ms_mean": None, "modelled_e2e_ms_mean_scaled": None,
        "client_overhead_ms_p50": None,
    }  # fmt: skip
    served = failed | {"errors": 0, "wall_e2e_ms_mean": 12.5, "modelled_e2e_ms_mean_scaled": 10.0}
    served |= {"client_overhead_ms_p50": 2.5, "requests_per_s": 80.0}
    heading, row_failed, row_served = bench.http_table([failed, served])
    assert heading.split() == [
        "time-scale",
        "req/s",
        "wall",
        "e2e",
        "ms",
        "model/ts",
        "ms",
        "overhead",
        "p50",
        "ms",
        "errors",
    ]
    assert row_failed.split() == ["1.0", "0.0", "-", "-", "-", "3"]
    assert row_served.split() == ["1.0", "80.0", "12.5", "10.0", "2.5", "0"]
    assert len(heading) == len(row_failed) == len(row_served)  # the columns line up
