"""The operator's permission probe never runs the fleet's commands, even behind a proxy.

The probe queues the fleet's real commands (``HSET``/``HDEL``/``DEL`` on the membership hash, ``SET``
and ``DEL`` of load records, ``PUBLISH``...) in a ``MULTI`` transaction to learn which ones the ACL
denies. 2870a24 ended that transaction with a ``GET`` without its key (refused as it is queued) and
``EXEC``, relying on Redis answering ``EXECABORT``. Something between the operator and Redis that
answers that ``GET`` itself and forwards the ``EXEC`` (a proxy pinning a transaction to one upstream,
as Envoy's Redis proxy does) leaves the upstream transaction clean: ``EXEC`` then runs every queued
write, deleting the fleet's membership each round. Specification: the transaction holding the
fleet's commands is never followed by ``EXEC`` (DISCARD, or the connection closed); EXEC's own
permission is still found, on a request that holds nothing to run.

The proxy is in this file: it answers a ``GET`` without a key itself (as a proxy validating arity
would) and forwards every other command, on one upstream connection per client, to a real
Valkey/Redis, relaying its replies as they come.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import BinaryIO

import pytest

from prefixfleet.operator.handlers import OperatorContext
from tests import test_operator_redis_permissions as permissions_tests
from tests.test_operator_redis_permissions import ALL_FLEET_KEYS, PASSWORD, AclRedis
from tests.test_operator_redis_refusals import PREFIX, FakeRedis, read_command, rounds

acl_redis = permissions_tests.acl_redis
ctx = permissions_tests.ctx
pytestmark = pytest.mark.slow

MEMBERS = f"{PREFIX}members"


def read_reply(reader: BinaryIO) -> bytes:
    """One RESP2/RESP3 reply, as the bytes it came in (to relay it unchanged)."""
    line = reader.readline()
    if not line:
        raise ConnectionError("the upstream closed")
    kind, rest = line[:1], line[1:-2]
    if kind in (b"$", b"!", b"=") and rest != b"-1":
        return line + reader.read(int(rest) + 2)
    if kind in (b"*", b"~", b">", b"%", b"|") and rest != b"-1":
        count = int(rest) * (2 if kind in (b"%", b"|") else 1)
        return line + b"".join(read_reply(reader) for _ in range(count))
    return line  # + - : _ # , ( and null bulk strings and arrays


def encode(argv: list[str]) -> bytes:
    return f"*{len(argv)}\r\n".encode() + b"".join(f"${len(a.encode())}\r\n{a}\r\n".encode() for a in argv)


class AnsweringProxy(FakeRedis):
    """A Redis proxy on a loopback port the kernel picks (the fake server's listener): a ``GET``
    without its key is answered here (an arity error), never forwarded; everything else goes to
    ``upstream_port``, on one upstream connection per client. ``forwarded`` holds every command it
    forwarded, in order."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.forwarded: list[list[str]] = []
        super().__init__()

    def serve(self, client: socket.socket) -> None:
        with (
            client,
            client.makefile("rb") as from_client,
            socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10) as upstream,
            upstream.makefile("rb") as from_upstream,
            contextlib.suppress(OSError, ConnectionError),  # either side gone: the session ends
        ):
            while (argv := read_command(from_client)) is not None:
                if [a.upper() for a in argv] == ["GET"]:
                    client.sendall(b"-ERR wrong number of arguments for 'get' command\r\n")
                    continue
                self.forwarded.append(argv)
                upstream.sendall(encode(argv))
                client.sendall(read_reply(from_upstream))


@contextlib.contextmanager
def answering_proxy(server: AclRedis) -> Iterator[AnsweringProxy]:
    proxy = AnsweringProxy(server.port)
    try:
        yield proxy
    finally:
        proxy.close()


def exec_after_fleet_commands(forwarded: list[list[str]]) -> list[list[str]]:
    """The EXECs the proxy forwarded to end a transaction that held a command of the fleet."""
    ran, in_multi, holding = [], False, False
    for argv in forwarded:
        name = argv[0].upper()
        if name == "MULTI":
            in_multi, holding = True, False
        elif name in ("EXEC", "DISCARD"):
            if name == "EXEC" and in_multi and holding:
                ran.append(argv)
            in_multi = False
        elif in_multi and any(a.startswith(PREFIX) for a in argv[1:]):
            holding = True
    return ran


@pytest.mark.parametrize("user", [None, "fleet"])
def test_a_proxy_answering_a_command_itself_never_gets_the_fleets_commands_run(
    acl_redis: AclRedis, ctx: OperatorContext, user: str | None
) -> None:
    # before (2870a24's probe): the proxy answered the keyless GET itself, the upstream transaction
    # stayed clean and the forwarded EXEC ran the queued HSET, HDEL, DEL members, SET, DEL, PUBLISH:
    # the fleet's membership hash was gone after the first round
    acl_redis.admin.hset(MEMBERS, "refused-replica-9", '{"url": "http://10.0.0.9:8000"}')
    if user is not None:
        acl_redis.user(user, *ALL_FLEET_KEYS)
    userinfo = "" if user is None else f"{user}:{PASSWORD}"
    listener = acl_redis.admin.pubsub()
    listener.psubscribe(f"{PREFIX}*")
    try:
        assert listener.get_message(timeout=5)["type"] == "psubscribe"  # type: ignore[index]
        with answering_proxy(acl_redis) as proxy:
            found = rounds(ctx, proxy.url(userinfo), 3)
            forwarded = list(proxy.forwarded)
        published = listener.get_message(timeout=0.2)
    finally:
        listener.close()
    assert acl_redis.admin.hgetall(MEMBERS) == {b"refused-replica-9": b'{"url": "http://10.0.0.9:8000"}'}
    assert acl_redis.admin.dbsize() == 1  # no load record or summary written either
    assert published is None, published
    assert exec_after_fleet_commands(forwarded) == []
    # and the probe still found nothing to deny through the proxy
    assert found == [("", "", "")] * 3


def test_exec_denied_is_still_found_without_a_transaction_to_run(
    acl_redis: AclRedis, ctx: OperatorContext
) -> None:
    acl_redis.user("no-exec", *ALL_FLEET_KEYS, "-exec")
    with answering_proxy(acl_redis) as proxy:
        [(login, permissions, refused)] = rounds(ctx, proxy.url(f"no-exec:{PASSWORD}"))
        forwarded = list(proxy.forwarded)
    assert (login, refused) == ("", "")
    assert permissions is not None and permissions.endswith(
        "denies it commands the fleet runs: EXEC (the operator: membership (a transaction))."
        " Grant them (ACL SETUSER; docs/operator.md)"
    ), permissions
    assert exec_after_fleet_commands(forwarded) == []
    assert acl_redis.admin.dbsize() == 0
