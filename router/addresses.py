"""Base URLs of replicas from a host and a port, IPv6 included.

A pod's IP on an IPv6 (or dual-stack, IPv6-first) cluster is ``fd00::12``; ``http://fd00::12:8100``
is no URL (every colon after the scheme reads as the port's), ``http://[fd00::12]:8100`` is. The
operator builds a member's URL from the pod IP, and the sidecar's ``--advertise-url`` comes from the
pod spec as ``http://$(POD_IP):<port>``, an expansion that cannot add the brackets itself.
"""

from __future__ import annotations

import ipaddress


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


def bracket_ipv6_url(url: str) -> str:
    """``http://fd00::12:8100/x`` -> ``http://[fd00::12]:8100/x``; any other URL unchanged.

    Only a host that is an IPv6 address once its last ``:<digits>`` (the port) is taken off is
    bracketed, so a URL that is already valid never changes."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    host, colon, port = authority.rpartition(":")
    if not colon or not port.isdigit() or "@" in authority:
        return url
    bracketed = host_for_url(host)
    if bracketed == host:
        return url
    return f"{scheme}://{bracketed}:{port}{slash}{path}"
