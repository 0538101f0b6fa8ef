"""Whether the fleet's Redis lets its ACL user run every command the fleet runs.

A user may PING (so the operator's login check finds nothing) and still be denied a command, a key or a
channel the fleet needs: the operator's membership, the sidecars' load records, the gateways' pushes.
Those fail one call at a time, each only logged by whichever process ran it. The operator asks Redis
once per reconcile, with the same credentials as every pod of the fleet, by queueing each command in
a transaction it then discards (DISCARD, never EXEC): Redis checks a queued command's ACL permissions
(command, keys, channels) when it queues it, so a denial is answered without anything being written
or published.

An error that is about neither the credentials nor the ACL (a read-only replica, out of memory, a
dataset loading, a script running, a failed snapshot, a proxy without the command) is not a denial:
it is said apart (``refusal_problem``), with Redis's own error, since the fleet's calls get it too.

``fleet_commands`` (which commands, on which keys, for whom), ``permission_problem`` and
``refusal_problem`` (the messages) and ``login_args`` are pure; ``probe_commands`` and ``login`` (the
credentials proven each round, on the same kept connections) are the round trips.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn
from urllib.parse import unquote, urlsplit

import redis
from redis.connection import AbstractConnection, ConnectionPool
from redis.credentials import UsernamePasswordCredentialProvider
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    BusyLoadingError,
    ExecAbortError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)

from prefixfleet.router import redis_conn
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.redis_conn import OLDER_THAN_6, handshake_unknown


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

    @property
    def described(self) -> str:
        """``NAME on key K (who: what for)``, for a message."""
        return f"{self.name}{' on ' + self.on if self.on else ''} ({self.needed_by})"


def fleet_commands(keys: FleetKeys, worker: str) -> tuple[FleetCommand, ...]:
    """Every command the operator, the sidecars (``--no-self-register``) and the gateways run on the
    fleet's Redis besides PING, with the keys and channels they run it on (docs/redis.md)."""
    members, load, summary = keys.members, keys.load(worker), keys.summary(worker)
    engine = keys.engine(worker)
    operator, sidecars, gateways = "the operator", "the sidecars", "the gateways"
    control, token = keys.control, "the control token"

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
        FleetCommand(("MGET", engine), f"{gateways}: engine records", key(engine)),
        FleetCommand(("MGET", summary), f"{gateways} and the autoscaler: cache summaries", key(summary)),
        FleetCommand(("SET", load, "{}", "PX", "10000"), f"{sidecars}: load records", key(load)),
        FleetCommand(("SET", summary, "", "PX", "10000"), f"{sidecars}: cache summaries", key(summary)),
        FleetCommand(("SET", engine, "{}", "PX", "10000"), f"{sidecars}: engine records", key(engine)),
        FleetCommand(("PEXPIRE", summary, "10000"), f"{sidecars}: cache summaries", key(summary)),
        FleetCommand(("DEL", load, summary, engine), f"{sidecars}: leaving", key(load, summary, engine)),
        FleetCommand(("PUBLISH", keys.loads, ""), f"{sidecars}: load pushes", channel(keys.loads)),
        FleetCommand(("SET", control, "", "NX"), f"{operator} and {sidecars}: {token}", key(control)),
        FleetCommand(("GET", control), f"{operator} and {sidecars}: {token}", key(control)),
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
PING = FleetCommand(("PING",), "the operator, the sidecars and the gateways")
# redis-py 8 opens every connection with HELLO 3 (RESP3), the fleet's pods' as the operator's
HELLO = FleetCommand(("HELLO",), "every Redis client of the fleet, as it connects: Redis 6 or later")
# The explicit AUTH of the login check (login): what a client of the fleet logging in with AUTH sends
AUTH = FleetCommand(("AUTH",), "the operator's login check, and each client of the fleet logging in with it")
# What ends the probe's transaction: never EXEC, which would run the fleet's commands wherever the
# transaction was not aborted (a proxy answering a command itself and forwarding the EXEC).
DISCARD = ("DISCARD",)
# ResponseError prefixes of a refused login that redis-py may not have mapped to AuthenticationError
AUTH_REFUSALS = ("WRONGPASS", "NOAUTH")

# A command and the error Redis answered it with.
Refusal = tuple[FleetCommand, str]


@dataclass(frozen=True, slots=True)
class ProbeAnswer:
    """What Redis answered the probe's commands: those it denies the ACL user (NOPERM), and those it
    refused for another reason, each with Redis's error (a read-only replica, out of memory...)."""

    denied: tuple[FleetCommand, ...] = ()
    refused: tuple[Refusal, ...] = ()
    # DISCARD, which ends the probe's transaction, denied (the fleet never runs it: no verdict, but
    # the probe's connection is closed and a new one dialled every round; discard_hint)
    discard_denied: bool = False


class RedisRefused(RedisError):
    """Redis answered the login's PING with an error about neither the credentials nor the ACL (a
    dataset loading, a script running, writes stopped after a failed snapshot): every call of the
    fleet gets it too; or refused the connection itself (``message``, :data:`MAX_CLIENTS_REFUSED`).
    ``refused`` has the commands it refused; the message is :func:`refusal_problem`'s otherwise."""

    def __init__(self, refused: Sequence[Refusal], message: str = "") -> None:
        self.refused = tuple(refused)
        super().__init__(message or refusal_problem(self.refused))


# What Redis answers a new connection beyond its maxclients limit (``-ERR max number of clients
# reached``, then it closes it). redis-py raises it as a ConnectionError, as if Redis were
# unreachable, but Redis answered, and every new connection of the fleet's pods gets the same.
MAX_CLIENTS = "max number of clients reached"
# Said from this constant, never from the exception's text: nothing of the URL or the password
MAX_CLIENTS_REFUSED = (
    "the fleet's Redis refuses new connections: max number of clients reached (maxclients), not for"
    " the fleet's credentials or ACL: new connections of its pods are refused too. Raise maxclients"
    " (CONFIG SET maxclients) or find what holds its connections (CLIENT LIST)"
)


class NoPasswordSet(RedisRefused):
    """Redis refused the login's ``AUTH <password>`` because it has no password set (Redis 6+:
    ``AUTH <password> called without any password configured...``, Redis 5: ``Client sent AUTH, but
    no password is set``; redis-py raises both as an AuthenticationError). Not a wrong password: the
    fleet gives a password to a Redis that takes none, which the user must fix (the handler names the
    field that holds it). A default user without a password takes any in ``HELLO 3 AUTH default
    <password>`` (redis-py 8's handshake), so the fleet's clients connect meanwhile."""

    def __init__(self) -> None:
        super().__init__(((AUTH, "no password is set"),))


# How Redis words NoPasswordSet (6 and later, 5)
_NO_PASSWORD_SET = ("without any password configured", "no password is set")


def no_password_set(exc: RedisError) -> bool:
    """Whether ``exc`` is Redis refusing an AUTH because it has no password set (NoPasswordSet)."""
    return any(said in str(exc) for said in _NO_PASSWORD_SET)


def auth_error_text(exc: ResponseError) -> str:
    """An AUTH's error as a message may say it: never Redis's text, which may quote the command's
    arguments (Redis 5's ``unknown command `AUTH`, with args beginning with: `<password>`,``)."""
    code = server_error(exc).split(" ", 1)[0]
    if "unknown command" in str(exc).lower():
        return f"{code} unknown command (a proxy or server without AUTH)"
    return f"{code} (its text is not repeated: it may quote the password)"


def max_clients_reached(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing a new connection for its maxclients limit."""
    return isinstance(exc, redis.ConnectionError) and MAX_CLIENTS in str(exc)


def raise_refused_for_max_clients(exc: redis.ConnectionError) -> NoReturn:
    """Raise ``exc`` as :class:`RedisRefused` when it is a maxclients refusal; else as it is (the
    connection unreachable, reset or timed out: an outage)."""
    if max_clients_reached(exc):
        raise RedisRefused((), MAX_CLIENTS_REFUSED) from exc
    raise exc


# The error codes redis-py drops from the text of the errors it maps to a class of its own.
_ERROR_CODES: tuple[tuple[type[RedisError], str], ...] = (
    (BusyLoadingError, "LOADING"),
    (ReadOnlyError, "READONLY"),
    (OutOfMemoryError, "OOM"),
    (ExecAbortError, "EXECABORT"),
    (NoPermissionError, "NOPERM"),
)
# A proxy's error could be any length; a condition's message need not be
MAX_ERROR_CHARS = 400


def server_error(exc: RedisError) -> str:
    """Redis's error as it sent it (``READONLY You can't write...``): redis-py keeps the code of some
    (``status_code``, redis-py >= 6) and drops it from the text of those it maps to a class."""
    text = str(exc)
    code = getattr(exc, "status_code", None) or next((c for t, c in _ERROR_CODES if isinstance(exc, t)), "")
    said = text if not code or text.startswith(code) else f"{code} {text}"
    return said if len(said) <= MAX_ERROR_CHARS else said[: MAX_ERROR_CHARS - 3] + "..."


def acl_user(dial_url: str) -> str:
    """The ACL user a URL logs in as (Redis's ``default`` when it names none). Only asked once Redis
    accepted the credentials, so a name here is a user's, not a password put in its place."""
    return unquote(urlsplit(dial_url).username or "") or "default"


def permission_problem(user: str, denied: Sequence[FleetCommand]) -> str:
    """The Degraded message: which commands the ACL user may not run, on what, needed by whom."""
    if not denied:
        return ""
    said = "; ".join(c.described for c in denied)
    return (
        f"the fleet's Redis accepted ACL user {user!r} but denies it commands the fleet runs: {said}."
        " Grant them (ACL SETUSER; docs/operator.md)"
    )


def discard_hint(user: str) -> str:
    """What to tell once about an ACL user denied DISCARD (ProbeAnswer.discard_denied)."""
    return (
        f"the fleet's Redis denies ACL user {user!r} DISCARD: the fleet never runs it, but the operator's"
        " permission check ends its transaction with it, so it closes that connection and dials a new"
        " connection every round instead. Grant it +discard (the minimal user: docs/operator.md)"
    )


def refusal_problem(refused: Sequence[Refusal]) -> str:
    """The Degraded message for commands the fleet runs that Redis answers with an error about
    neither the credentials nor the ACL: each with Redis's error, those with the same error together."""
    if not refused:
        return ""
    by_error: dict[str, list[FleetCommand]] = {}
    for command, error in refused:
        by_error.setdefault(error, []).append(command)
    said = "; ".join(
        f"{', '.join(c.described for c in commands)}: {error}" for error, commands in by_error.items()
    )
    return f"the fleet's Redis refuses commands the fleet runs, not for its credentials or ACL: {said}"


def pooled_connection(pool: ConnectionPool) -> AbstractConnection:
    """A connection of ``pool``, to be given back with ``pool.release``. redis-py before 5.3 (the
    project takes redis>=5) requires a command name, which it ignores; 5.3 made it optional and
    later releases warn when one is given: it is passed only where required."""
    parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    if parameter is not None and parameter.default is inspect.Parameter.empty:
        return pool.get_connection("PING")
    return pool.get_connection()


def probe_commands(client: redis.Redis, commands: Sequence[FleetCommand]) -> ProbeAnswer:
    """Which of ``commands`` (and MULTI/EXEC) the server denies the user (NOPERM) or refuses for
    another reason, found without running any: they are queued in a transaction that DISCARD ends.
    Errors of the connection and timeouts propagate (an outage, said elsewhere); a server that does
    not queue after MULTI (a proxy answering OK) tells nothing without running them.

    The transaction holding the fleet's commands is never followed by EXEC, whatever was answered:
    an EXEC would run them wherever the transaction was not aborted as Redis aborts it (a proxy
    answering a command itself, which then executes the rest upstream: ``DEL`` on the fleet's
    membership every round). It ends with DISCARD, which runs nothing; when the user may not run
    DISCARD the connection is closed, which ends the transaction on the server, running nothing (one
    new connection per round for such a user). EXEC's own permission is asked before, outside any
    transaction: ``EXEC`` alone answers ``EXEC without MULTI`` when allowed, NOPERM when denied (the
    ACL is checked first), and leaves no transaction open on any Redis >= 6.

    The connection comes from ``client``'s pool and goes back to it (the operator's per-URL client:
    no new connection per reconcile) only once every reply was read and it is known to be outside a
    transaction; otherwise (an error, a timeout, a proxy, DISCARD refused) it is closed first, so
    the pool never hands out one left inside MULTI or with a reply still unread."""
    pool = client.connection_pool
    conn = pooled_connection(pool)
    reusable = False
    try:
        # EXEC outside a transaction (the pool's connections are outside one), then MULTI and a
        # harmless PING, the fleet's commands only once PING was QUEUED: were MULTI refused, or taken
        # by a server that does not queue (a proxy answering OK), they would run
        conn.send_packed_command(conn.pack_commands([EXEC.argv, MULTI.argv, PING.argv]))
        exec_denied: tuple[FleetCommand, ...] = ()
        try:
            conn.read_response()  # a list only where EXEC ran an empty transaction (a proxy): nothing
        except ResponseError as exc:
            # allowed: "EXEC without MULTI". Denied: NOPERM (Redis 6.0), or EXECABORT quoting the
            # NOPERM (6.2 and later answer a refused EXEC so, inside a transaction or not)
            if isinstance(exc, NoPermissionError) or "NOPERM" in str(exc):
                exec_denied = (EXEC,)
        try:
            conn.read_response()
        except ResponseError as exc:
            # no transaction: the PING ran on its own (PONG) and its reply is read: nothing pending
            with contextlib.suppress(ResponseError):
                reusable = conn.read_response() in (b"PONG", "PONG")
            if isinstance(exc, NoPermissionError):
                return ProbeAnswer(denied=(MULTI,))
            return ProbeAnswer(refused=((MULTI, server_error(exc)),))  # e.g. a proxy without MULTI
        if conn.read_response() not in (b"QUEUED", "QUEUED"):
            return ProbeAnswer()  # not a transaction: nothing we can tell without running the commands
        conn.send_packed_command(conn.pack_commands([c.argv for c in commands] + [DISCARD]))
        denied: list[FleetCommand] = []
        refused: list[Refusal] = []
        for command in commands:
            try:
                conn.read_response()
            except NoPermissionError:
                denied.append(command)
            except ResponseError as exc:
                refused.append((command, server_error(exc)))  # READONLY, OOM, MISCONF, unknown...
        # DISCARD refused (the fleet never runs it): the connection, still inside the transaction,
        # is closed below, and the server drops the transaction with it
        discard_denied = False
        try:
            reusable = conn.read_response() in (b"OK", "OK", True)
        except NoPermissionError:
            discard_denied = True
        except ResponseError:
            pass
        return ProbeAnswer((*denied, *exec_denied), tuple(refused), discard_denied)
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


def redis_error_text(exc: BaseException) -> str:
    """``exc`` as a log line or a message may repeat it (the router's :func:`redis_conn.redis_error_text`,
    which the sidecars and gateways use too): its text, except for Redis before 6 refusing the HELLO
    every connection of redis-py >= 8 opens with, quoting HELLO's arguments, the password among them.
    Every Redis call of the operator (membership, the autoscaler's reads, a deletion's cleanup)
    fails with it on such a Redis, each reconcile: its log line said the password every 10 s."""
    return redis_conn.redis_error_text(exc, f"HELLO ({HELLO.needed_by})")


def about_login(exc: ResponseError) -> bool:
    """Whether Redis's error is about the credentials (refused, none sent) or the ACL."""
    return isinstance(exc, (AuthenticationError, NoPermissionError)) or str(exc).startswith(AUTH_REFUSALS)


def login_answers(
    conn: AbstractConnection, auth: tuple[str, ...]
) -> tuple[ResponseError | None, ResponseError | None]:
    """The errors Redis answers ``auth`` and a PING with, in one round trip (None: accepted). A
    dataset still loading is RedisRefused: redis-py raises it as a ConnectionError (and drops the
    connection), but Redis answered, and the fleet's calls get the same. So is an AUTH refused
    because Redis has no password set: NoPasswordSet (redis-py drops the connection there too)."""
    conn.send_packed_command(conn.pack_commands([auth, PING.argv]))
    answers: list[ResponseError | None] = []
    for _ in range(2):
        try:
            conn.read_response()
            answers.append(None)
        except ResponseError as exc:
            answers.append(exc)
        except BusyLoadingError as exc:
            raise RedisRefused(((PING, server_error(exc)),)) from exc
        except AuthenticationError as exc:
            if no_password_set(exc):
                raise NoPasswordSet() from exc
            raise
        except redis.ConnectionError as exc:
            # a client that sends nothing as it connects (redis-py < 8 without credentials) may read
            # a maxclients refusal here, as the AUTH's answer (when it comes before the pool's check,
            # redis-py says "Connection not ready": an outage, as before; not tested, a race)
            raise_refused_for_max_clients(exc)
    return answers[0], answers[1]


def login(client: redis.Redis) -> None:
    """Prove ``client``'s credentials to its Redis now, and that they may PING: ``AUTH`` with them
    (without credentials: :data:`NO_PASSWORD_PROBE`, which only a default user that needs no
    password accepts) and ``PING``, one round trip, on a connection of ``client``'s pool.
    Returns when both are accepted; raises what Redis answers otherwise (AuthenticationError for
    refused credentials, NoPermissionError for a denied PING, :class:`RedisRefused` for a PING
    refused for another reason, a new connection refused for maxclients or an AUTH with credentials
    answered with an error about neither them nor the ACL (a proxy without AUTH;
    :class:`NoPasswordSet`: a password given to a Redis that has none set) and errors and timeouts
    (an outage). Without credentials the AUTH is the operator's own: an error of that kind to it
    leaves the PING to answer.

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
    except ResponseError as exc:
        if not handshake_unknown(exc):
            raise
        raise RedisRefused(((HELLO, OLDER_THAN_6),)) from exc
    except redis.ConnectionError as exc:
        raise_refused_for_max_clients(exc)
    reusable = False
    try:
        auth = login_args(conn)
        auth_error, ping_error = login_answers(conn, ("AUTH", *(auth or NO_PASSWORD_PROBE)))
        if isinstance(auth_error, AuthenticationWrongNumberOfArgsError) and not auth:
            auth_error = None  # older than 6, no credentials: the PING's answer is all there is
        elif isinstance(auth_error, AuthenticationWrongNumberOfArgsError) and len(auth) == 2:
            # a Redis older than 6 (no users): the password alone, as redis-py's handshake does, so
            # the fleet's pods log in the same way; its PING again (it was asked before that AUTH)
            auth_error, ping_error = login_answers(conn, ("AUTH", auth[-1]))
        if auth_error is not None and not about_login(auth_error) and not auth:
            # no AUTH of the fleet's (it has no credentials): the probe's is the operator's own, and
            # an AUTH unknown here (a proxy) says nothing of it: the PING's answer is all there is
            auth_error = None
        elif auth_error is not None and not about_login(auth_error):
            # not a verdict on the credentials (a proxy without AUTH): Redis answered, said apart
            reusable = True
            raise RedisRefused(((AUTH, auth_error_text(auth_error)),)) from auth_error
        if auth_error is not None:
            raise auth_error  # the AUTH's refusal before the PING's
        if ping_error is not None and not about_login(ping_error):
            # logged in, both replies read: the connection is as good as before (no reconnect each
            # round while, say, a snapshot keeps failing)
            reusable = True
            raise RedisRefused(((PING, server_error(ping_error)),)) from ping_error
        if ping_error is not None:
            raise ping_error
        reusable = True
    except AuthenticationError:
        pool.disconnect(inuse_connections=False)
        raise
    finally:
        if not reusable:
            conn.disconnect()
        pool.release(conn)
