"""Base URLs of replicas from a host and a port, IPv6 included.

A pod's IP on an IPv6 (or dual-stack, IPv6-first) cluster is ``fd00::12``; ``http://fd00::12:8100``
is no URL (every colon after the scheme reads as the port's), ``http://[fd00::12]:8100`` is. The
operator builds a member's URL from the pod IP, and the sidecar's ``--advertise-url`` comes from the
pod spec as ``http://$(POD_IP):<port>``, an expansion that cannot add the brackets itself.
"""

from __future__ import annotations

import ipaddress
import re


def host_for_url(host: str) -> str:
    """``host`` as it goes between ``//`` and ``:port``: an IPv6 address in brackets."""
    if host.startswith("[") or ":" not in host:
        return host
    try:
        ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return host  # not an address: left for the URL check to refuse
    return f"[{host}]"


def base_url(host: str, port: int, scheme: str = "http") -> str:
    return f"{scheme}://{host_for_url(host)}:{port}"


def connect_host(listen_host: str) -> str:
    """The address a process on this machine dials to reach a server listening on ``listen_host``:
    the loopback of the wildcard's family (``''`` listens on both, so IPv4's), else the address itself
    (a server bound to ``::1`` alone is not on ``127.0.0.1``)."""
    if listen_host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if listen_host.strip("[]") == "::":
        return "::1"
    return listen_host.strip("[]")


def local_url(listen_host: str, port: int) -> str:
    """The base URL of this machine's own server listening on ``listen_host``:``port``."""
    return base_url(connect_host(listen_host), port)


def _is_port_digits(port: str) -> bool:
    # ASCII only: str.isdigit() also takes '²' (int() then raises) and '٣' (read as 3), which no
    # client, RE2 rule (the CRD's) or Redis URL parser reads as a port
    return port.isascii() and port.isdigit()


def bracket_ipv6_url(url: str) -> str:
    """``http://fd00::12:8100/x`` -> ``http://[fd00::12]:8100/x``; any other URL unchanged.

    Only a host that is an IPv6 address once its last ``:<digits>`` (the port) is taken off is
    bracketed, so a URL that is already valid never changes."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    host, colon, port = authority.rpartition(":")
    if not colon or not _is_port_digits(port) or "@" in authority:
        return url
    bracketed = host_for_url(host)
    if bracketed == host:
        return url
    return f"{scheme}://{bracketed}:{port}{slash}{path}"


def authority_error(url: str) -> str | None:
    """Why the host and port of ``url`` cannot be read, or None when they can (``unix://`` included).

    An IPv6 address without brackets is the usual case (``redis://fd00::12:6379/0``: every client
    reads the port after the first colon); the message names the bracketed URL to write instead."""
    _scheme, sep, rest = url.partition("://")
    if not sep or url.startswith("unix://"):
        return None
    authority = rest
    for end in "/?#":
        authority = authority.partition(end)[0]
    authority = authority.rpartition("@")[2]  # after any user:password
    if authority.startswith("["):
        host, closed, port = authority[1:].partition("]")
        if not closed:
            return f"{authority!r} opens a [ it does not close"
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            return f"[{host}] is not an IPv6 address"
        if port and not port.startswith(":"):
            return f"{authority!r} has {port!r} after the ] (expected :PORT)"
        port = port[1:]
    elif authority.count(":") > 1:
        repaired = bracket_ipv6_url(url)
        hint = f": write {repaired}" if repaired != url else ""
        return f"an IPv6 address goes in brackets{hint}"
    else:
        port = authority.partition(":")[2]
    if port and not (_is_port_digits(port) and 0 < int(port) < 65536):
        return f"the port {port!r} is not a number in 1..65535"
    return None


REDIS_URL_SCHEMES = ("redis://", "rediss://", "unix://")


def _client_options_error(url: str) -> str | None:
    """Why redis-py would refuse the URL's query options, or None. It reads them only when it makes
    its first connection (``?db=x``: "Invalid value for 'db'"; ``?sslcert=...``, an option no
    connection takes: a TypeError), so a URL that passed every other check failed at the first
    command, far from the flag or Secret that gave it. Asked of redis-py itself (its rules change
    between versions), with no I/O: making a connection object does not connect. The reasons name
    the option, never a value. A redis:// URL is judged as rediss://, whose connections take the TLS
    options too: PREFIXFLEET_REDIS_TLS turns it into one where it is used."""
    from redis.asyncio.connection import ConnectionPool

    probe = "rediss://" + url.removeprefix("redis://") if url.startswith("redis://") else url
    try:
        ConnectionPool.from_url(probe).make_connection()
    except ValueError as exc:
        named = _QUOTED_NAME.search(str(exc))
        return f"its query option {named[1]!r} has a value redis-py cannot read" if named else str(exc)
    except TypeError as exc:  # "...__init__() got an unexpected keyword argument 'sslcert'"
        named = _QUOTED_NAME.search(str(exc))
        option = repr(named[1]) if named else "in its query"
        return f"redis-py takes no connection option {option}"
    return None


_QUOTED_NAME = re.compile(r"'([^']*)'")


def without_userinfo(url: str) -> str:
    """``url`` with everything between its scheme and its last ``@`` (user and password) as
    ``***``: safe to print however broken the URL is (a parser may not find the password in it)."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    return f"{scheme}://***@{rest.rpartition('@')[2]}"


def redis_url_error(url: str) -> str | None:
    """Why a ``--redis`` URL (the sidecar's, the gateway's, the operator's, or one in a Secret) is
    refused: its scheme, then its host and port; or None. The reason quotes no part of the URL
    that may be a password."""
    if not url.startswith(REDIS_URL_SCHEMES):
        return "not a redis://, rediss:// or unix:// URL"
    problem = authority_error(url)
    if problem is None:
        return _client_options_error(url)
    userinfo = url.partition("://")[2].rpartition("@")[0]
    if not userinfo:
        return problem  # nothing secret in it: the hint may write the URL out again
    if any(c in userinfo for c in "/?#"):
        # the host is read up to the first '/', '?' or '#': before the '@' that is inside the
        # password, and authority_error would quote the piece of it it took for the host and port
        return (
            "the host and port cannot be read: a '/', '?' or '#' before the '@' ends them"
            " (in a password write %2F, %3F, %23)"
        )
    return problem.partition(": write ")[0]  # the hint writes the URL out again, password and all
