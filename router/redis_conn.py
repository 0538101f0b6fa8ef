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
