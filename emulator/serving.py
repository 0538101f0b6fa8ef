"""HTTP plumbing every API face of the emulator shares (SGLang's in server.py, vLLM's in vllm_api.py).

Reading a JSON body, submitting a call's prompts all-or-none, merging several requests' updates,
server-sent events, the error middleware and the application with its body guards. What differs
between the faces — routes, request and response shapes, error bodies — is passed in.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from prefixfleet.router.proxying import body_guards
from prefixfleet.router.slow_clients import ClientTimeouts

from .engine import RequestRejected
from .protocol import BadRequest, Call
from .runner import EngineRunner, EngineStopped, RequestHandle, Snapshot

log = logging.getLogger("prefixfleet.emulator")

ENGINE_KEY = web.AppKey("engine", EngineRunner)
EXPECT_KEY = web.AppKey("expect_handler", object)  # the body guards' Expect: 100-continue handler

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# (message, param, status, kind) -> the face's JSON error answer; kind: the error type a BadRequest
# names (vLLM's faces tell "Bad Request" from "BadRequestError"), None for the face's default
JsonError = Callable[[str, str | None, int, str | None], web.Response]
# an aiohttp HTTP error (404, 405, 413 ...) -> the face's answer, or None to let it through as is
HttpError = Callable[[web.HTTPException], web.StreamResponse | None]


def errors_middleware(json_error: JsonError, http_error: HttpError) -> Any:
    """Every failure becomes the face's JSON answer; the server keeps serving."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except BadRequest as exc:
            return json_error(exc.message, exc.param, exc.status, getattr(exc, "kind", None))
        except RequestRejected as exc:
            return json_error(str(exc), "input", 400, None)
        except EngineStopped as exc:
            return json_error(str(exc), None, 503, None)
        except RequestPayloadError:  # the body read (here or by the slow-client guard) failed to decode:
            # e.g. Content-Encoding: gzip over bytes that are no gzip stream; the client's fault, not ours
            encoding = request.headers.get("Content-Encoding", "")
            message = f"request body cannot be decoded (Content-Encoding: {encoding!r})"
            return json_error(message, "body", 400, None)
        except web.HTTPException as exc:
            answer = http_error(exc)
            if answer is not None:
                return answer
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:
            log.exception("unhandled error serving %s %s", request.method, request.path)
            return json_error("internal error in the emulator (see its log)", None, 500, None)

    return errors


def make_app(
    engine: EngineRunner, json_error: JsonError, http_error: HttpError, auth: Any = None
) -> web.Application:
    """The application without routes: error middleware, body guards, the engine under ENGINE_KEY.
    Add routes with ``expect_handler=app[EXPECT_KEY]`` on POSTs. ``auth``: the face's API-key
    middleware (:mod:`.auth`), innermost, so a refused request's body was read within the guards'
    limits and the 401 reaches a client still sending it."""
    timeouts = ClientTimeouts.from_env()

    def body_error(_request: web.Request, status: int, message: str) -> web.Response:
        return json_error(message, "body", status, None)

    # Bodies are taken as the gateway and the sidecar take them (router/proxying.py body_guards):
    # Content-Encoding gzip/deflate decoded, another coding a 415, a body that does not decode as its
    # coding a 400; an error answered before the body was read whole is sent, then the body's rest
    # dropped while the client sends (a client that writes its whole body before reading, httpx,
    # reads the answer, not a reset). SGLang ignores the header and reads the bytes as they came
    # (docs/emulator.md, differences).
    guards = body_guards(timeouts, body_error)
    app = web.Application(
        middlewares=[
            errors_middleware(json_error, http_error),
            *guards.middlewares,
            *([auth] if auth else []),
        ],
        client_max_size=engine.config.max_body_bytes,
    )
    app[ENGINE_KEY] = engine
    app[EXPECT_KEY] = guards.expect_handler
    return app


async def read_json(request: web.Request) -> Any:
    raw = await request.read()  # within the limit: body_deadline read it
    if not raw.strip():
        raise BadRequest("request body is empty; expected a JSON object", "body")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", "body") from None


def submit(engine: EngineRunner, call: Call) -> list[RequestHandle]:
    """Submit every prompt of a call, all or none."""
    for prompt, max_new in zip(call.prompts, call.max_new_tokens, strict=True):
        engine.check_fits(len(prompt), max_new)
    handles: list[RequestHandle] = []
    try:
        for i, (prompt, max_new, rid) in enumerate(
            zip(call.prompts, call.max_new_tokens, call.rids, strict=True)
        ):
            handles.append(engine.submit(prompt, max_new, rid, namespace=call.namespace(i)))
    except Exception:
        for h in handles:
            h.abort()
        raise
    return handles


def abort_unfinished(handles: list[RequestHandle]) -> None:
    for h in handles:
        if h.request.finished_at is None:
            h.abort()


async def merged(handles: list[RequestHandle]) -> AsyncIterator[tuple[int, Snapshot]]:
    """Updates of several requests as they happen, tagged with the request's index."""
    if len(handles) == 1:
        async for snap in handles[0].updates():
            yield 0, snap
        return
    queue: asyncio.Queue[tuple[int, Snapshot | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, handle: RequestHandle) -> None:
        try:
            async for snap in handle.updates():
                await queue.put((i, snap))
            await queue.put((i, None))
        except Exception as exc:
            await queue.put((i, exc))

    tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(handles)]
    try:
        remaining = len(handles)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()


async def sse_response(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    return response


async def send(response: web.StreamResponse, obj: object) -> None:
    await response.write(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


async def send_done(response: web.StreamResponse) -> None:
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
