"""Whether the fleet's Redis lets its ACL user run every command the fleet runs.

A user may PING (so the operator's login check finds nothing) and still be denied a command, a key or a
channel the fleet needs: the operator's membership, the sidecars' load records, the gateways' pushes.
Those fail one call at a time, each only logged by whichever process ran it. The operator asks Redis
once per reconcile, with the same credentials as every pod of the fleet, by queueing each command in
a transaction it then discards: Redis checks a queued command's ACL permissions (command, keys,
channels) when it queues it, so a denial is answered without anything being written or published.

``fleet_commands`` (which commands, on which keys, for whom), ``permission_problem`` (the message)
and ``login_args`` are pure; ``denied_commands`` and ``login`` (the credentials proven each round,
on the same kept connections) are the round trips.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import redis
from redis.connection import AbstractConnection, ConnectionPool
from redis.credentials import UsernamePasswordCredentialProvider
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    NoPermissionError,
    ResponseError,
)

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


def pooled_connection(pool: ConnectionPool) -> AbstractConnection:
    """A connection of ``pool``, to be given back with ``pool.release``. redis-py before 5.3 (the
    project takes redis>=5) requires a command name, which it ignores; 5.3 made it optional and
    later releases warn when one is given: it is passed only where required."""
    parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    if parameter is not None and parameter.default is inspect.Parameter.empty:
        return pool.get_connection("PING")
    return pool.get_connection()


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
    conn = pooled_connection(pool)
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


def login_args(conn: AbstractConnection) -> tuple[str, ...]:
    """The arguments of the AUTH a new connection of ``conn``'s settings sends when it connects
    (redis-py's rule: ``user password``, or ``password`` alone when the URL names no user, i.e. the
    default user); () when it has no credentials, so sends no AUTH."""
    if conn.credential_provider is None and not (conn.username or conn.password):
        return ()
    provider = conn.credential_provider or UsernamePasswordCredentialProvider(conn.username, conn.password)
    return tuple(provider.get_credentials())


# What a connection without credentials logs in with to prove the default user still takes none: a
# ``nopass`` user accepts any password, one with a password (CONFIG SET requirepass, ACL SETUSER
# default >pw) or switched off refuses it, as it now refuses every new connection of the fleet's pods.
# Not a secret: it names what it is for, and is only ever sent to the default user.
NO_PASSWORD_PROBE = ("default", "prefixfleet-checks-that-no-password-is-needed")


def login(client: redis.Redis) -> None:
    """Prove ``client``'s credentials to its Redis now, and that they may PING: ``AUTH`` with them
    (without credentials: :data:`NO_PASSWORD_PROBE`, which only a default user that needs no
    password accepts) and ``PING``, one round trip, on a connection of ``client``'s pool.
    Returns when both are accepted; raises what Redis answers otherwise (AuthenticationError for
    refused credentials, NoPermissionError for a denied PING) and errors and timeouts (an outage).

    The pool keeps its connections across reconciles, each logged in when it was dialled, and Redis
    keeps a connection logged in when the user's password changes: a PING alone would go on being
    answered after a password rotated on the server (ACL SETUSER ... resetpass >new), while every new
    connection of the fleet's pods is refused. An explicit AUTH is checked against the password Redis
    holds now, on whichever pooled connection this round gets; so is the default user's going on
    needing none (a password set on a Redis that had none leaves its kept connections logged in
    too). A Redis older than 6 (no users) answers the probe's two arguments as a wrong number: it
    cannot be asked without guessing its password, so its PING alone answers. Once refused, the pool's idle
    connections (logged in with the refused credentials) are closed; one in use by another call is
    left to it (closing it would cut that call; it goes with the client once no fleet uses the URL).
    The connection goes back to the pool only when both replies were read and accepted."""
    pool = client.connection_pool
    try:
        conn = pooled_connection(pool)  # a new one logs in as it connects (refused: AuthenticationError)
    except AuthenticationError:
        pool.disconnect(inuse_connections=False)
        raise
    reusable = False
    try:
        auth = login_args(conn)
        conn.send_packed_command(conn.pack_commands([("AUTH", *(auth or NO_PASSWORD_PROBE)), ("PING",)]))
        refusals: list[ResponseError] = []
        for _ in range(2):
            try:
                conn.read_response()
            except ResponseError as exc:
                refusals.append(exc)
        wrong_number = bool(refusals) and isinstance(refusals[0], AuthenticationWrongNumberOfArgsError)
        if wrong_number and not auth:
            refusals = refusals[1:]  # older than 6, no credentials: the PING's answer is all there is
        elif wrong_number and len(auth) == 2:
            # a Redis older than 6 (no users: its PING was refused unauthenticated, or answered):
            # the password alone, as redis-py's handshake does, so the fleet's pods log in the same way
            conn.send_command("AUTH", auth[-1])
            conn.read_response()
            refusals = []
        if refusals:
            raise refusals[0]  # the AUTH's refusal before the PING's
        reusable = True
    except AuthenticationError:
        pool.disconnect(inuse_connections=False)
        raise
    finally:
        if not reusable:
            conn.disconnect()
        pool.release(conn)
