"""A stand-in engine for sidecar tests: ``/health`` answers 200, the rest is the test's.

Shared by the tests/test_sidecar_*.py and tests/test_prewarm_*.py files that need an engine which
misbehaves on purpose (holds a request, refuses it, names its identity late) behind a real sidecar.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def healthy(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def stand_in_engine(
    post: Mapping[str, Handler] | None = None, get: Mapping[str, Handler] | None = None
) -> web.Application:
    """An app answering ``GET /health`` with 200 and each path of ``post``/``get`` with its handler
    (other paths: 404, which the sidecar's engine discovery takes as "not reported")."""
    app = web.Application()
    app.router.add_get("/health", healthy)
    for path, handler in (get or {}).items():
        app.router.add_get(path, handler)
    for path, handler in (post or {}).items():
        app.router.add_post(path, handler)
    return app
