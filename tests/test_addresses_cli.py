"""Unbracketed IPv6 addresses in the data plane's URL flags are refused up front, naming the fix.

``http://::1:30000`` or ``redis://fd00::12:6379/0`` cannot be read by any client (the port would be
read after the first colon): the sidecar crashed with a traceback on such an ``--engine``, the
gateway answered 503 to every request for such a ``--worker``, and a ``--redis`` like it was a
traceback. Each is now a one-line usage error (exit 2) naming the bracketed URL to write. The
sidecar's ``--advertise-url`` is the exception: it is repaired, since the pod spec's
``http://$(POD_IP):PORT`` cannot add the brackets (covered in test_ipv6_addresses.py).

Specification:
* ``authority_error`` is None for every URL ``base_url`` builds and for IPv4, names, bracketed IPv6,
  credentials and ``unix://``; it names the bracketed URL for an unbracketed IPv6 one, and refuses
  an unclosed bracket, a bracketed non-address and a port that is no number in 1..65535;
* the CLI refuses each flag's unbracketed IPv6 URL with exit 2, one line, no traceback.
"""

from __future__ import annotations

import subprocess

import pytest
from fleet_fixtures import prefixfleet_argv
from hypothesis import given
from hypothesis import strategies as st

from prefixfleet.router.addresses import authority_error, base_url

pytestmark = pytest.mark.timeout(60)


@given(host=st.ip_addresses().map(str), port=st.integers(1, 65535), scheme=st.sampled_from(["http", "redis"]))
def test_every_built_url_has_a_readable_authority(host: str, port: int, scheme: str) -> None:
    assert authority_error(base_url(host, port, scheme) + "/0") is None


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.7:8100",
        "http://replica-0.demo.svc:8100/v1",
        "http://[fd00::12]:8100",
        "http://[::1]",
        "http://[fe80::1%eth0]:8100",
        "redis://:se:cret@[::1]:6379/0",
        "rediss://user:pw@redis.demo:6380/2",
        "unix:///var/run/redis.sock",
        "http://sidecar",
    ],
)
def test_readable_authorities(url: str) -> None:
    assert authority_error(url) is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://::1:30000", "an IPv6 address goes in brackets: write http://[::1]:30000"),
        ("redis://fd00::12:6379/0", "write redis://[fd00::12]:6379/0"),
        ("redis://:pw@fd00::12:6379/0", "an IPv6 address goes in brackets"),
        ("http://[::1:30000", "opens a [ it does not close"),
        ("http://[sidecar]:8100", "[sidecar] is not an IPv6 address"),
        ("http://[::1]8100", "expected :PORT"),
        ("http://sidecar:http", "the port 'http' is not a number"),
        ("http://sidecar:70000", "not a number in 1..65535"),
        # str.isdigit() takes these (int('²') raised; '٣' read as 3): no client reads them as a port
        ("redis://h:²/0", "the port '²' is not a number"),
        ("redis://h:٣/0", "the port '٣' is not a number"),
    ],
)
def test_unreadable_authorities_are_named(url: str, says: str) -> None:
    problem = authority_error(url)
    assert problem is not None and says in problem


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["router", "sidecar", "--engine", "http://::1:30000", "--port", "8100"],
         "--engine 'http://::1:30000': an IPv6 address goes in brackets: write http://[::1]:30000"),
        (["router", "sidecar", "--engine", "http://[::1]:30000", "--port", "8100",
          "--redis", "redis://::1:6379/0"],
         "--redis 'redis://::1:6379/0': an IPv6 address goes in brackets: write redis://[::1]:6379/0"),
        (["router", "gateway", "--worker", "http://fd00::12:8100", "--port", "8080"],
         "--worker 'http://fd00::12:8100': an IPv6 address goes in brackets: write http://[fd00::12]:8100"),
        (["router", "gateway", "--redis", "redis://::1:6379/0", "--port", "8080"],
         "write redis://[::1]:6379/0"),
        (["router", "inspect", "--redis", "redis://::1:6379/0"], "write redis://[::1]:6379/0"),
    ],
)  # fmt: skip
def test_the_cli_refuses_an_unbracketed_ipv6_url_in_one_line(argv: list[str], says: str) -> None:
    out = subprocess.run(prefixfleet_argv(*argv), capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 2, out.stderr
    assert says in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["router", "sidecar", "--engine", "http://127.0.0.1:30000", "--port", "8100", "--redis"],
        ["router", "gateway", "--port", "8080", "--redis"],
        ["operator", "run", "--redis"],
    ],
)
@pytest.mark.parametrize(
    ("url", "says"),
    [
        # a base64 password with '/': the host is read up to it, and the old message quoted that piece
        ("redis://:s3cr/etpw@h:6379/0", "--redis 'redis://***@h:6379/0': the host and port cannot be read"),
        ("redis://:s3cretpw@fd00::12:6379/0", "'redis://***@fd00::12:6379/0': an IPv6 address goes in"),
        ("http://:s3cretpw@h:6379/0", "'http://***@h:6379/0': not a redis://, rediss:// or unix:// URL"),
    ],
)  # fmt: skip
def test_a_refused_redis_url_is_named_without_its_password(argv: list[str], url: str, says: str) -> None:
    argv = prefixfleet_argv(*argv, url)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 2, out.stderr
    assert says in out.stderr
    assert "s3cr" not in out.stderr and "Traceback" not in out.stderr
