"""Bad flags of `prefixfleet router sidecar|gateway|inspect|bench-overhead`: one line, exit 2.

Specification: a value the data plane cannot run with is refused before anything starts, with
``prefixfleet router SERVICE: error: ...`` naming the flag, exit status 2 and no traceback:
* an interval, a rate or a duration that is NaN or infinite (``value <= 0`` let them through: a NaN
  ``--dead-after`` made every worker dead, a NaN ``--refresh-interval`` or ``--prefill-tokens-per-s``
  poisoned every comparison), as well as zero or negative ones;
* a worker, engine or advertised URL that names no host (``http://``: every request failed later);
* an unknown ``--log-level`` (a ValueError traceback from logging);
* a ``--json`` path that cannot be written (inspect wrote it after reading the fleet: a
  FileNotFoundError traceback; bench-overhead after its whole run).
Every case fails before a socket is opened, so none needs a server.
"""

from __future__ import annotations

import pytest

from prefixfleet.cli import main

UNDER_A_FILE = f"{__file__}/x.json"  # a path whose parent is a regular file: never writable
REDIS = ("--redis", "redis://127.0.0.1:9/0")
GATEWAY = ["router", "gateway", "--port", "18080", *REDIS]
SIDECAR = ["router", "sidecar", "--port", "18081", "--engine", "http://127.0.0.1:9"]

CASES = [
    *[
        ([*GATEWAY, flag, value], f"{flag} must be positive, got {value}")
        for flag in ("--refresh-interval", "--dead-after", "--overlay-ttl", "--prefill-tokens-per-s")
        for value in ("nan", "inf", "0", "-1")
    ],
    *[
        ([*SIDECAR, flag, value], f"{flag} must be positive, got {value}")
        for flag in ("--publish-interval", "--prefill-tokens-per-s")
        for value in ("nan", "inf", "-1")
    ],
    ([*GATEWAY, "--max-retries", "-1"], "--max-retries must not be negative"),
    ([*GATEWAY, "--max-resends-after-receipt", "-1"], "--max-resends-after-receipt must not be negative"),
    (["router", "gateway", "--port", "18080", "--worker", "http://"], "--worker 'http://' names no host"),
    (["router", "gateway", "--port", "18080", "--worker", "http://:8000"], "names no host"),
    (["router", "sidecar", "--port", "18081", "--engine", "https://"], "--engine 'https://' names no host"),
    ([*SIDECAR, "--advertise-url", "http:///x"], "--advertise-url 'http:///x' names no host"),
    ([*GATEWAY, "--log-level", "LOUD"], "--log-level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ([*SIDECAR, "--log-level", ""], "--log-level must be one of"),
    (["router", "inspect", *REDIS, "--json", UNDER_A_FILE], "--json: "),
    (["router", "inspect", *REDIS, "--json", ""], "--json is empty"),
    (["router", "bench-overhead", "--json", UNDER_A_FILE], "--json: "),
    (["router", "bench-overhead", "--rate", "nan"], "--rate must be positive, got nan"),
    (["router", "bench-overhead", "--time-scale", "inf"], "--time-scale must be positive, got inf"),
]


@pytest.mark.parametrize(
    ("argv", "message"), CASES, ids=lambda v: " ".join(v)[-50:] if isinstance(v, list) else ""
)
def test_a_bad_flag_is_one_line_naming_it(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"prefixfleet router {argv[1]}: error: "), lines[0]
    assert message in lines[0], lines[0]
