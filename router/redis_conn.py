"""Connecting to the fleet's Redis with credentials and TLS from the environment (Kubernetes Secrets).

A password in the URL (``redis://:secret@host:6379/0``) works but shows in the process list and in
pod specs, so the password can instead come from ``PREFIXFLEET_REDIS_PASSWORD`` (an env var filled
from a Secret by ``secretKeyRef``) or from the file named by ``PREFIXFLEET_REDIS_PASSWORD_FILE`` (a
mounted Secret); ``PREFIXFLEET_REDIS_USERNAME`` names an ACL user. TLS: a ``rediss://`` URL, or
``PREFIXFLEET_REDIS_TLS=1`` to upgrade a ``redis://`` URL; ``PREFIXFLEET_REDIS_CA_FILE`` verifies the
server against a private CA. A password already in the URL wins over the environment.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import redis.asyncio as aioredis

PASSWORD_ENV = "PREFIXFLEET_REDIS_PASSWORD"
PASSWORD_FILE_ENV = "PREFIXFLEET_REDIS_PASSWORD_FILE"
USERNAME_ENV = "PREFIXFLEET_REDIS_USERNAME"
TLS_ENV = "PREFIXFLEET_REDIS_TLS"
CA_FILE_ENV = "PREFIXFLEET_REDIS_CA_FILE"
_TRUE = {"1", "true", "yes", "on"}


class RedisSettingsError(ValueError):
    """The Redis credentials/TLS settings in the environment are unusable (named in the message)."""


def redis_options(url: str, environ: Mapping[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """The URL to connect to and the extra ``from_url`` keyword arguments the environment asks for."""
    env = os.environ if environ is None else environ
    parts = urlsplit(url)
    options: dict[str, Any] = {}
    if not parts.password:
        password = env.get(PASSWORD_ENV) or None
        path = env.get(PASSWORD_FILE_ENV)
        if password is None and path:
            try:
                password = Path(path).read_text().strip() or None
            except OSError as exc:
                raise RedisSettingsError(f"{PASSWORD_FILE_ENV}: cannot read {path}: {exc.strerror}") from None
        if password is not None:
            options["password"] = password
            if env.get(USERNAME_ENV):
                options["username"] = env[USERNAME_ENV]
    if env.get(TLS_ENV, "").strip().lower() in _TRUE and parts.scheme == "redis":
        url = "rediss://" + url[len("redis://") :]
    if url.startswith("rediss://") and env.get(CA_FILE_ENV):
        options["ssl_ca_certs"] = env[CA_FILE_ENV]
    return url, options


def connect_redis(
    url: str, *, timeout_s: float = 1.0, environ: Mapping[str, str] | None = None
) -> aioredis.Redis:
    """An asyncio Redis client for ``url`` with the environment's credentials and TLS settings."""
    target, options = redis_options(url, environ)
    return aioredis.from_url(target, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, **options)


def with_credentials(url: str, password: str | None, *, tls: bool = False) -> str:
    """``url`` carrying ``password`` (unless it has one already) and upgraded to ``rediss://`` when
    ``tls``: for a process that read the password from a Secret itself (the operator)."""
    parts = urlsplit(url)
    if password and not parts.password and parts.scheme in ("redis", "rediss"):
        user = parts.username or ""
        netloc = f"{user}:{quote(password, safe='')}@{parts.netloc.rpartition('@')[2]}"
        url = parts._replace(netloc=netloc).geturl()
    if tls and url.startswith("redis://"):
        url = "rediss://" + url[len("redis://") :]
    return url


def redacted(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for logs)."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


# What Redis before 6 answers redis-py >= 8's HELLO, as said here (never Redis's own text)
OLDER_THAN_6 = "ERR unknown command (a Redis older than 6)"
# The command it refused, for a log line of a process that is not the operator (which says whose)
HANDSHAKE = "HELLO (redis-py >= 8 opens every connection with it: Redis 6 or later)"
_UNKNOWN_HELLO = re.compile(r"unknown command\W{0,3}hello\b", re.IGNORECASE)


def handshake_unknown(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis's answer to the ``HELLO 3 AUTH <user> <password>`` that redis-py >= 8
    opens every connection with, as an unknown command: Redis before 6. Redis 5 words it ``unknown
    command `HELLO`, with args beginning with: `3`, `AUTH`, `<user>`, `<password>`,``: its text must
    never be repeated. Matched on the text whatever the exception's class (a wrapper keeps it), and
    Redis 4's ``unknown command 'HELLO'`` or a proxy's lowercase name alike."""
    return _UNKNOWN_HELLO.search(str(exc)) is not None


def redis_error_text(exc: BaseException, handshake: str = HANDSHAKE) -> str:
    """``exc`` as a log line, a message or an error shown to a user may repeat it: its text, except
    for Redis before 6 refusing the HELLO (:func:`handshake_unknown`), said as ``handshake``:
    :data:`OLDER_THAN_6`. Every Redis call of a sidecar, a gateway or the operator fails with it on
    such a Redis, its log line repeated with each outage warning: it said the password."""
    if handshake_unknown(exc):
        return f"{handshake}: {OLDER_THAN_6}"
    return str(exc)
