"""Whether the fleet's Redis lets its ACL user run every command the fleet runs.

A user may PING (so the operator's login check finds nothing) and still be denied a command, a key or a
channel the fleet needs: the operator's membership, the sidecars' load records, the gateways' pushes.
Those fail one call at a time, each only logged by whichever process ran it. The operator asks Redis
once per reconcile, with the same credentials as every pod of the fleet, by queueing each command in
a transaction it then discards: Redis checks a queued command's ACL permissions (command, keys,
channels) when it queues it, so a denial is answered without anything being written or published.

``fleet_commands`` (which commands, on which keys, for whom) and ``permission_problem`` (the message)
are pure; ``denied_commands`` is the round trip.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import redis
from redis.exceptions import NoPermissionError, ResponseError

from prefixfleet.router.keys import FleetKeys


@dataclass(frozen=True, slots=True)
class FleetCommand:
    """One command as a component of the fleet runs it (``argv``), and who runs it for what."""

    argv: tuple[str, ...]
    needed_by: str
    # the keys or channels it touches, for the message (Redis names neither in its refusal)
    on: str = ""

    @property
    def name(self) -> str:
        return " ".join(self.argv[:2]) if self.argv[0] == "PUBSUB" else self.argv[0]


def fleet_commands(keys: FleetKeys, worker: str) -> tuple[FleetCommand, ...]:
    """Every command the operator, the sidecars (``--no-self-register``) and the gateways run on the
    fleet's Redis besides PING, with the keys and channels they run it on (docs/redis.md)."""
    members, load, summary = keys.members, keys.load(worker), keys.summary(worker)
    operator, sidecars, gateways = "the operator", "the sidecars", "the gateways"

    def key(*names: str) -> str:
        return ("key " if len(names) == 1 else "keys ") + ", ".join(names)

    def channel(*names: str) -> str:
        return ("channel " if len(names) == 1 else "channels ") + ", ".join(names)

    return (
        FleetCommand(("HGETALL", members), f"{operator} and {gateways}: membership", key(members)),
        FleetCommand(("HSET", members, worker, "{}"), f"{operator}: membership", key(members)),
        FleetCommand(("HDEL", members, worker), f"{operator}: membership", key(members)),
        FleetCommand(("DEL", members), f"{operator}: deleting the fleet", key(members)),
        FleetCommand(("GET", load), f"{operator}: drains", key(load)),
        FleetCommand(("MGET", load), f"{gateways} and the autoscaler: load records", key(load)),
        FleetCommand(("MGET", summary), f"{gateways} and the autoscaler: cache summaries", key(summary)),
        FleetCommand(("SET", load, "{}", "PX", "10000"), f"{sidecars}: load records", key(load)),
        FleetCommand(("SET", summary, "", "PX", "10000"), f"{sidecars}: cache summaries", key(summary)),
        FleetCommand(("PEXPIRE", summary, "10000"), f"{sidecars}: cache summaries", key(summary)),
        FleetCommand(("DEL", load, summary), f"{sidecars}: leaving", key(load, summary)),
        FleetCommand(("PUBLISH", keys.loads, ""), f"{sidecars}: load pushes", channel(keys.loads)),
        FleetCommand(
            ("PUBLISH", keys.events, ""), f"{operator} and {sidecars}: change notices", channel(keys.events)
        ),
        FleetCommand(("PUBLISH", keys.sends, ""), f"{gateways}: send notices", channel(keys.sends)),
        FleetCommand(
            ("SUBSCRIBE", keys.loads, keys.sends),
            f"{gateways}: load pushes and peers' sends",
            channel(keys.loads, keys.sends),
        ),
        FleetCommand(("PUBSUB", "NUMSUB", keys.sends), f"{gateways}: send notices", channel(keys.sends)),
    )


# The operator's membership writes are one MULTI/EXEC transaction.
MULTI = FleetCommand(("MULTI",), "the operator: membership (a transaction)")
EXEC = FleetCommand(("EXEC",), "the operator: membership (a transaction)")


def acl_user(dial_url: str) -> str:
    """The ACL user a URL logs in as (Redis's ``default`` when it names none). Only asked once Redis
    accepted the credentials, so a name here is a user's, not a password put in its place."""
    return unquote(urlsplit(dial_url).username or "") or "default"


def permission_problem(user: str, denied: Sequence[FleetCommand]) -> str:
    """The Degraded message: which commands the ACL user may not run, on what, needed by whom."""
    if not denied:
        return ""
    said = "; ".join(f"{c.name}{' on ' + c.on if c.on else ''} ({c.needed_by})" for c in denied)
    return (
        f"the fleet's Redis accepted ACL user {user!r} but denies it commands the fleet runs: {said}."
        " Grant them (ACL SETUSER; docs/operator.md)"
    )


def denied_commands(client: redis.Redis, commands: Sequence[FleetCommand]) -> list[FleetCommand]:
    """Those of ``commands`` (and MULTI/EXEC) the server refuses with NOPERM, found without running
    any: they are queued in a transaction that is discarded. Redis errors and timeouts propagate (an
    outage, said elsewhere); a server that takes no MULTI for another reason, or does not queue after
    it (a proxy), denies nothing we can tell.

    The connection comes from ``client``'s pool and goes back to it (the operator's per-URL client:
    no new connection per reconcile) only once every reply was read and it is known to be outside a
    transaction; otherwise (an error, a timeout, a proxy, a DISCARD refused) it is closed first, so
    the pool never hands out one left inside MULTI or with a reply still unread."""
    pool = client.connection_pool
    conn = pool.get_connection()
    reusable = False
    try:
        # MULTI and a harmless PING first, the fleet's commands only once PING was QUEUED: were MULTI
        # refused, or taken by a server that does not queue (a proxy answering OK), they would run
        conn.send_packed_command(conn.pack_commands([MULTI.argv, ("PING",)]))
        try:
            conn.read_response()
        except NoPermissionError:
            # no transaction: the PING ran on its own; its reply read, nothing is left pending
            with contextlib.suppress(ResponseError):
                conn.read_response()
            reusable = True
            return [MULTI]
        except ResponseError:
            return []  # e.g. a proxy without MULTI: its state is its own, not reused
        if conn.read_response() not in (b"QUEUED", "QUEUED"):
            return []  # not a transaction: nothing we can tell without running the commands
        conn.send_packed_command(conn.pack_commands([c.argv for c in commands] + [("DISCARD",)]))
        denied = []
        for command in commands:
            try:
                conn.read_response()
            except NoPermissionError:
                denied.append(command)
            except ResponseError:
                pass  # not about permissions
        try:
            conn.read_response()  # DISCARD
        except ResponseError:
            return denied  # still in the transaction: no EXEC on this connection, and it is closed
        conn.send_command(*EXEC.argv)
        try:
            conn.read_response()  # outside a transaction: "EXEC without MULTI" when allowed
        except ResponseError as exc:
            # a refused EXEC answers EXECABORT (redis-py's ExecAbortError) quoting the NOPERM
            if isinstance(exc, NoPermissionError) or "NOPERM" in str(exc):
                denied.append(EXEC)
            reusable = True  # an error: no transaction was open (an EXEC that answered is not reused)
        return denied
    finally:
        if not reusable:
            conn.disconnect()
        pool.release(conn)
