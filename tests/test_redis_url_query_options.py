"""A Redis URL whose query options redis-py cannot use is refused where it is given, not at the first
command.

redis-py reads a URL's query (``?db=2&socket_timeout=5``) only when it makes its first connection:
``redis://r:6379/?db=x`` raised "Invalid value for 'db' in connection URL" and ``?sslcert=...`` (an
option no connection takes) a TypeError from the connection's constructor, inside the sidecar's or
the operator's first Redis call, far from the flag or Secret that gave the URL. Specification:

* ``redis_url_error`` names the option (never a value, which may be a password) for a value
  redis-py cannot convert and for a name no connection takes;
* options redis-py takes pass, TLS ones on a redis:// URL included (PREFIXFLEET_REDIS_TLS turns
  it into rediss:// where it is used);
* the sidecar, the gateway and ``operator run`` refuse such a ``--redis`` with exit 2 in one line,
  without the URL's password.
"""

from __future__ import annotations

import subprocess

import pytest
from fleet_fixtures import prefixfleet_argv

from prefixfleet.router.addresses import redis_url_error

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://r:6379/?db=x", "its query option 'db' has a value redis-py cannot read"),
        ("redis://r:6379/0?socket_timeout=soon", "its query option 'socket_timeout'"),
        ("unix:///run/valkey.sock?db=two", "its query option 'db'"),
        ("redis://:pw@r:6379/0?sslcert=/etc/c.pem", "redis-py takes no connection option 'sslcert'"),
        ("unix:///run/valkey.sock?ssl_cert_reqs=none", "no connection option 'ssl_cert_reqs'"),
    ],
)
def test_an_option_redis_py_cannot_use_is_named(url: str, says: str) -> None:
    problem = redis_url_error(url)
    assert problem is not None and says in problem


@pytest.mark.parametrize(
    "url",
    [
        "redis://r:6379/0?socket_timeout=5&health_check_interval=10",
        "redis://r:6379/?db=3",
        "redis://r:6379/0?ssl_cert_reqs=none",  # made rediss:// by PREFIXFLEET_REDIS_TLS
        "rediss://:pw@r:6380/0?ssl_cert_reqs=required&client_name=gw",
        "unix:///run/valkey.sock?db=2",
    ],
)
def test_options_redis_py_takes_pass(url: str) -> None:
    assert redis_url_error(url) is None


def test_a_refused_option_never_quotes_a_value() -> None:
    problem = redis_url_error("redis://r:6379/0?password=s3cretpw&db=s3cretdb")
    assert problem is not None and "s3cret" not in problem


@pytest.mark.parametrize(
    "argv",
    [
        ["router", "sidecar", "--engine", "http://127.0.0.1:30000", "--port", "8100", "--redis"],
        ["router", "gateway", "--port", "8080", "--redis"],
        ["operator", "run", "--redis"],
    ],
)
def test_the_cli_refuses_it_in_one_line_without_the_password(argv: list[str]) -> None:
    out = subprocess.run(
        prefixfleet_argv(*argv, "redis://:s3cretpw@r:6379/?db=x"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert "--redis 'redis://***@r:6379/?db=x': its query option 'db'" in out.stderr
    assert "s3cr" not in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
