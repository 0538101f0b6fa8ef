"""`prefixfleet operator run`: run the kopf operator in this process.

Equivalent to ``kopf run -m prefixfleet.operator.handlers`` with the project's defaults: standalone
(one active operator; no peering objects needed), cluster-wide unless ``--namespace`` is given, and a
liveness endpoint for the Deployment's probe.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import socket
from typing import Any

from prefixfleet.cli import UsageError, listen_error
from prefixfleet.router.addresses import authority_error, redis_url_error, without_userinfo

from .models import PROMETHEUS_URL_PATTERN

# Modules whose import registers kopf handlers; later parts (e.g. the autoscaler's timer) add theirs
# here and are skipped while they do not exist.
HANDLER_MODULES: tuple[str, ...] = (
    "prefixfleet.operator.handlers",
    "prefixfleet.operator.autoscale_handlers",
)
# HOST may be a bracketed IPv6 address: http://[::]:8080/healthz on an IPv6-only cluster
LIVENESS_URL_PATTERN = r"^https?://(\[[^]/]+\]|[^/:\[\]]+):\d+(/.*)?$"


def register(subparsers: Any) -> None:
    run = subparsers.add_parser(
        "run",
        help="run the kopf operator that reconciles PrefixCacheFleets",
        description="Run the PrefixCacheFleet operator (kopf) in this process until SIGINT/SIGTERM.",
    )
    run.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        metavar="NS",
        help="serve only this namespace (repeatable; globs allowed); default: all namespaces",
    )
    run.add_argument(
        "--liveness",
        metavar="URL",
        default=None,
        help="serve the liveness probe here, e.g. http://0.0.0.0:8080/healthz",
    )
    run.add_argument(
        "--redis",
        metavar="URL",
        default=os.environ.get("PREFIXFLEET_REDIS_URL", ""),
        help="Redis URL for fleets whose spec names none (env PREFIXFLEET_REDIS_URL)",
    )
    run.add_argument(
        "--prometheus",
        metavar="URL",
        default=os.environ.get("PREFIXFLEET_PROMETHEUS_URL", ""),
        help="Prometheus the autoscaler reads engine rates from for fleets whose spec.prometheus names"
        " none (env PREFIXFLEET_PROMETHEUS_URL); without: each sidecar's /metrics",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=8081,
        metavar="PORT",
        help="serve the operator's Prometheus metrics on this port (0: off; default 8081)",
    )
    run.add_argument(
        "--metrics-addr",
        default=os.environ.get("PREFIXFLEET_METRICS_ADDR", "0.0.0.0"),
        metavar="ADDR",
        help="address the metrics port binds (env PREFIXFLEET_METRICS_ADDR; default 0.0.0.0)",
    )
    run.add_argument("--verbose", "-v", action="store_true", help="log every API call and handler step")
    run.set_defaults(func=run_operator)


def metrics_listen_problem(addr: str, port: int) -> str | None:
    """Why the metrics server could not listen on ``addr``:``port``, or None. Resolved as
    prometheus_client's start_http_server resolves it (a name or an address, IPv6 unbracketed), then
    bound once with its SO_REUSEADDR and released."""
    if not addr.strip():
        return "--metrics-addr is empty; give an address to bind, e.g. 0.0.0.0 (or :: for IPv6)"
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        hint = " (an IPv6 address goes unbracketed, e.g. ::)" if addr.startswith("[") else ""
        reason = exc.strerror if isinstance(exc, socket.gaierror) else "not a valid host name"
        return f"--metrics-addr {addr!r}: not an address this host can listen on: {reason}{hint}"
    family, _, _, _, sockaddr = infos[0]
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
    except OSError as exc:
        flags = {"host_flag": "--metrics-addr", "port_flag": "--metrics-port"}
        return listen_error(addr, port, exc, **flags) or f"--metrics-addr {addr!r}: cannot listen: {exc}"
    return None


def run_operator(args: argparse.Namespace) -> int:
    if args.liveness is not None and not re.fullmatch(LIVENESS_URL_PATTERN, args.liveness):
        raise UsageError(f"--liveness must look like http://HOST:PORT/PATH, got {args.liveness!r}")
    if args.redis and (problem := redis_url_error(args.redis)) is not None:  # printed without its password
        raise UsageError(f"--redis {without_userinfo(args.redis)!r}: {problem}")
    if args.prometheus and not re.fullmatch(PROMETHEUS_URL_PATTERN, args.prometheus):
        raise UsageError(f"--prometheus must be an http(s)://HOST[:PORT][/PATH] URL, got {args.prometheus!r}")
    urls = {"--liveness": args.liveness, "--prometheus": args.prometheus}
    for flag, url in urls.items():
        # the sidecar's and the CRD's host-and-port rule: refused by name here, not at a fleet's first dial
        if url and (problem := authority_error(url)) is not None:
            raise UsageError(f"{flag} {url!r}: {problem}")
    if not 0 <= args.metrics_port <= 65535:
        raise UsageError(f"--metrics-port must be between 0 and 65535, got {args.metrics_port}")
    if args.metrics_port and (problem := metrics_listen_problem(args.metrics_addr, args.metrics_port)):
        raise UsageError(problem)  # it only warned once kopf had started: no metrics, no autoscaler alerts
    from .kube import kube_config_problem

    if (problem := kube_config_problem()) is not None:
        raise UsageError(problem)
    import kopf

    for name in HANDLER_MODULES:
        try:
            importlib.import_module(name)  # registers its handlers with kopf's default registry
        except ModuleNotFoundError as exc:
            if not (exc.name and name.startswith(exc.name)):
                raise

    kopf.configure(verbose=args.verbose)
    memo = kopf.Memo(
        default_redis_url=args.redis,
        default_prometheus_url=args.prometheus,
        metrics_port=args.metrics_port,
        metrics_addr=args.metrics_addr,
    )
    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
        memo=memo,
    )
    return 0
