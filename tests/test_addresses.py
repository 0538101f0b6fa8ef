"""Address helpers on IPv6 literals: what goes between ``//`` and ``:port``, and back.

Specification:
* ``host_for_url`` brackets an IPv6 address (zone included) and nothing else: IPv4 addresses, names,
  already bracketed hosts and junk (left for the URL check to refuse) are unchanged;
* a URL built by ``base_url`` parses back (the data plane's ``split_url`` and the standard library's
  ``urlsplit``) to the same host and port, for any IPv4 or IPv6 address;
* ``bracket_ipv6_url`` is idempotent and never changes a URL ``base_url`` built;
* Redis URLs on an IPv6 host keep their brackets when credentials are added or redacted;
* ``connect_host`` / ``local_url``: the address a process dials to reach its own server, the
  wildcard's loopback for a wildcard, else the listening address itself (``::1`` stays ``::1``).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixfleet.router.addresses import (
    base_url,
    bracket_ipv6_url,
    connect_host,
    host_for_url,
    local_url,
)
from prefixfleet.router.redis_conn import redacted, redis_options, with_credentials
from prefixfleet.router.upstream import split_url

ports = st.integers(min_value=1, max_value=65535)
v4 = st.ip_addresses(v=4).map(str)
v6 = st.ip_addresses(v=6).map(str)


@pytest.mark.parametrize(
    ("host", "in_url"),
    [
        ("::1", "[::1]"),
        ("fd00::1:2", "[fd00::1:2]"),
        ("fe80::1%eth0", "[fe80::1%eth0]"),
        ("::ffff:10.0.0.7", "[::ffff:10.0.0.7]"),
        ("[fd00::1:2]", "[fd00::1:2]"),
        ("10.0.0.7", "10.0.0.7"),
        ("replica-0.demo.svc", "replica-0.demo.svc"),
        ("not:an:address", "not:an:address"),
    ],
)
def test_only_ipv6_addresses_are_bracketed(host: str, in_url: str) -> None:
    assert host_for_url(host) == in_url


@given(host=v4 | v6, port=ports)
def test_a_built_url_parses_back_to_its_host_and_port(host: str, port: int) -> None:
    url = base_url(host, port)
    origin, prefix = split_url(url)
    assert (origin.host, origin.port, origin.tls, prefix) == (host, port, False, "")
    parts = urlsplit(url)
    assert ipaddress.ip_address(parts.hostname or "") == ipaddress.ip_address(host)
    assert parts.port == port


@given(host=v4 | v6, port=ports, path=st.sampled_from(["", "/v1", "/a/b"]))
def test_bracketing_a_url_is_idempotent_and_keeps_built_urls(host: str, port: int, path: str) -> None:
    built = base_url(host, port) + path
    assert bracket_ipv6_url(built) == built
    unbracketed = f"http://{host}:{port}{path}"  # what the pod spec's http://$(POD_IP):PORT expands to
    assert bracket_ipv6_url(unbracketed) == built
    assert bracket_ipv6_url(bracket_ipv6_url(unbracketed)) == built


def test_the_origin_authority_of_an_ipv6_url_is_bracketed() -> None:
    origin, prefix = split_url("http://[fd00::1:2]:8100/base/")
    assert (origin.host, origin.port, prefix) == ("fd00::1:2", 8100, "/base")
    assert origin.authority == "[fd00::1:2]:8100"
    assert split_url("http://10.0.0.7:8100")[0].authority == "10.0.0.7:8100"


@pytest.mark.parametrize(
    ("listen", "dial"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("", "127.0.0.1"),  # every interface, both families: IPv4's loopback, as before
        ("0.0.0.0", "127.0.0.1"),
        ("::", "::1"),
        ("[::]", "::1"),
        ("::1", "::1"),
        ("fd00::1:2", "fd00::1:2"),
        ("10.0.0.7", "10.0.0.7"),
    ],
)
def test_a_process_dials_its_own_server_where_it_listens(listen: str, dial: str) -> None:
    assert connect_host(listen) == dial
    assert local_url(listen, 8100) == base_url(dial, 8100)


def test_the_local_url_of_a_server_on_the_ipv6_loopback_is_bracketed() -> None:
    assert local_url("::1", 8100) == "http://[::1]:8100"
    assert local_url("", 8100) == "http://127.0.0.1:8100"


def test_redis_urls_on_ipv6_keep_their_brackets_through_credentials_and_redaction() -> None:
    url = with_credentials("redis://[fd00::6]:6379/0", "p@ss:w/rd", tls=True)
    assert url == "rediss://:p%40ss%3Aw%2Frd@[fd00::6]:6379/0"
    assert redacted(url) == "rediss://:***@[fd00::6]:6379/0"
    target, options = redis_options("redis://[::1]:6379/0", {"PREFIXFLEET_REDIS_PASSWORD": "x"})
    assert target == "redis://[::1]:6379/0" and options == {"password": "x"}
    parts = urlsplit(url)
    assert (parts.hostname, parts.port) == ("fd00::6", 6379)
