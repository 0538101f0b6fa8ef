"""Pre-warming a replica from another replica's cache, sidecar to sidecar.

Two endpoints on every sidecar, called by the autoscaler (never by clients, never through Redis);
both are control routes: they need the fleet's control token (:mod:`.control`), and the replica
being warmed sends its own with each fetch from the source:

* ``GET /prefixfleet/prefix/{hash}`` on a replica that holds a hot prefix: the token ids of the cached
  prefix whose chained block hash (16 hex digits, as published in the summaries) is ``hash``, found in
  the sidecar's mirror tree; 404 when it is not held. Token ids stay pod-to-pod: Redis only ever
  holds hashes.
* ``POST /prefixfleet/warm {"source": URL, "hashes": [...], "hold_traffic": true}`` on the replica
  being warmed: each prefix is fetched from the source sidecar and replayed as a prefill request to
  this sidecar's own generation route, so it goes through the mirror like any request: SGLang's
  ``/generate`` with ``max_new_tokens: 0`` (prefill only); for a vLLM engine, which has no
  ``/generate``, ``/v1/completions`` with the token ids as ``prompt`` and ``max_tokens: 1`` (vLLM
  refuses fewer: :func:`prefill_request`). With ``hold_traffic`` (the default) its state is
  ``warming`` meanwhile (gateways send it nothing new), then ``ready``: for a new replica, warmed
  before it takes traffic. With ``hold_traffic: false`` the state is left alone and the replica
  keeps serving while it warms: for an existing replica, as the simulator models it. The answer
  reports the warmed tokens and, per hash, ``ok`` or why it failed.

Cache identity is respected: a prefix is replayed only when the source serves the same model,
revision and adapter (another identity names different blocks, so its cache would be useless here),
and a prefix cached under a LoRA adapter a request named (``lora_adapter`` in the prefix answer)
only where the engine has that adapter loaded; the request replayed is one that named it (kept
requests are keyed by the mirror namespace: tenant salt and adapter).

The autoscaler's side of the warm request is here too, shared by the operator and the local fleet:
:func:`warm_sources` picks a holder for each hot subtree, :func:`warm_replica` sends the target one
warm request per holder and tallies the answers into a :class:`WarmOutcome`.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
import httpx
import redis.asyncio as aioredis
from aiohttp import web

from prefixfleet.operator.hot_subtrees import find_prefix, parse_subtree_id

from .addresses import local_url
from .control import control_headers
from .engine_api import VLLM
from .exemplars import Exemplar
from .mirror import namespace_adapter, namespace_salt
from .proxying import (
    ExpectHandler,
    bad_request,
    error_message,
    find_cached_tokens,
    json_error,
    read_json_object,
)
from .requests import GENERATE_PATHS, BadRequest
from .summary import HotPrefix

if TYPE_CHECKING:
    from prefixfleet.operator.autoscale import SubtreeObservation

    from .sidecar import Sidecar

# The sidecar serving these routes (set by Sidecar.build_app).
SIDECAR_KEY: web.AppKey[Sidecar] = web.AppKey("sidecar")
MAX_WARM_HASHES = 64
FETCH_TIMEOUT_S = 10.0
PREFILL_TIMEOUT_S = 120.0
_URL = re.compile(r"https?://[^/\s]+")  # fullmatch: ``$`` would accept a trailing newline


@dataclass(frozen=True, slots=True)
class WarmRequest:
    source: str
    hashes: tuple[str, ...]
    hold_traffic: bool = True  # warming state (no new traffic) while it warms; absent: true


def parse_warm_request(body: Any) -> WarmRequest:
    """Validate a ``/prefixfleet/warm`` body; :class:`BadRequest` (a ValueError) names the bad field."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    source = body.get("source")
    if not isinstance(source, str) or not _URL.fullmatch(source.rstrip("/")):
        raise BadRequest(
            f"field 'source' must be a sidecar base URL like http://host:port, got {source!r}", param="source"
        )
    hashes = body.get("hashes")
    if not isinstance(hashes, list) or not all(isinstance(h, str) for h in hashes):
        raise BadRequest("field 'hashes' must be a list of 16-hex-digit prefix hashes", param="hashes")
    if len(hashes) > MAX_WARM_HASHES:
        too_many = f"field 'hashes' holds {len(hashes)} hashes; at most {MAX_WARM_HASHES} per request"
        raise BadRequest(too_many, param="hashes")
    for h in hashes:
        try:
            parse_subtree_id(h)
        except ValueError as exc:
            raise BadRequest(f"field 'hashes': {exc}", param="hashes") from None
    hold = body.get("hold_traffic", True)
    if not isinstance(hold, bool):
        raise BadRequest(f"field 'hold_traffic' must be true or false, got {hold!r}", param="hold_traffic")
    return WarmRequest(source.rstrip("/"), tuple(dict.fromkeys(hashes)), hold)


def lookup_prefix(sidecar: Sidecar, block_hash: int) -> HotPrefix | None:
    """The held prefix behind ``block_hash``: the summary's hot prefixes first (no walk), else the tree."""
    mirror = sidecar.s.mirror
    found = mirror.hot_prefixes.get(block_hash)
    if found is not None:
        return found
    return find_prefix(
        mirror.tree, block_hash, block_tokens=mirror.block_tokens, namespace_seed=mirror.namespace_seed
    )


async def handle_prefix(request: web.Request) -> web.Response:
    sidecar = request.app[SIDECAR_KEY]
    sid = request.match_info["hash"]
    try:
        block_hash = parse_subtree_id(sid)
    except ValueError as exc:
        return json_error(400, str(exc), param="hash")
    prefix = lookup_prefix(sidecar, block_hash)
    if prefix is None:
        return json_error(404, f"prefix {sid} is not cached on {sidecar.s.worker_id}", param="hash")
    engine = sidecar.s.engine
    # the kept request of the prefix's own namespace: its tenant salt and, for a prefix cached under
    # a LoRA adapter, that adapter (a base-model request with the same prompt warms other blocks)
    exemplar = sidecar.s.exemplars.holding(prefix.token_bytes, prefix.namespace)
    return web.json_response(
        {
            "hash": sid,
            "worker_id": sidecar.s.worker_id,
            "namespace": namespace_salt(prefix.namespace),
            "model": engine.model,
            "revision": engine.revision,
            "adapter": sidecar.config.adapter,
            # the LoRA adapter the prefix is cached under (its requests named it); None: none
            "lora_adapter": namespace_adapter(prefix.namespace),
            "num_tokens": len(prefix.token_bytes) // 4,
            # the sidecar's own word-tokenizer ids: they find the prefix, no engine takes them
            "mirror_token_ids": list(memoryview(prefix.token_bytes).cast("I")),
            "request": exemplar_json(exemplar) if exemplar is not None else None,
        }
    )


def exemplar_json(exemplar: Exemplar) -> dict[str, Any] | None:
    """A kept request as the prefix answer carries it: route, body (parsed) and its prompt's length
    in mirror tokens; None when the body no longer parses as a JSON object (it always did when kept)."""
    try:
        body = json.loads(exemplar.body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict):
        return None
    return {"path": exemplar.path, "body": body, "prompt_tokens": len(exemplar.token_bytes) // 4}


async def handle_warm(request: web.Request) -> web.Response:
    sidecar = request.app[SIDECAR_KEY]
    try:
        warm = parse_warm_request(await read_json_object(request))
    except BadRequest as exc:
        return bad_request(exc)
    if not warm.hold_traffic:  # an existing replica: it keeps serving, its warm-up queues with traffic
        results = await warm_prefixes(sidecar, warm.source, warm.hashes)
    else:
        previous = sidecar.s.state
        try:  # also the announcement: a client that leaves cancels this handler from any await on
            set_state(sidecar, "warming")
            await announce_state(sidecar)  # gateways know before the first prefill starts
            results = await warm_prefixes(sidecar, warm.source, warm.hashes)
        finally:
            # a draining replica stays draining: warming never overrides the operator's removal,
            # neither one from before the warm-up nor one set while it ran (only its own 'warming'
            # is lifted here; a drain undone here put a replica being removed back into rotation)
            if sidecar.s.state == "warming":
                set_state(sidecar, "draining" if previous == "draining" else "ready")
    return web.json_response(
        {
            "worker_id": sidecar.s.worker_id,
            "state": sidecar.s.state,
            "warmed_tokens": sum(r.get("tokens", 0) for r in results.values() if r["status"] == "ok"),
            "results": results,
        }
    )


def set_state(sidecar: Sidecar, state: str) -> None:
    if sidecar.s.state != state:
        sidecar.s.state = state
        sidecar.s.state_changed.set()


async def announce_state(sidecar: Sidecar) -> None:
    """Publish the state now rather than at the next publish round (best effort: Redis may be down,
    the publish loop then retries)."""
    if sidecar.redis is None:
        return
    with contextlib.suppress(aioredis.RedisError, OSError, TimeoutError):
        await sidecar.publish_once(register=True, periodic=False)
        await sidecar.redis.publish(sidecar.keys.events, f"state {sidecar.s.worker_id} {sidecar.s.state}")


async def warm_prefixes(sidecar: Sidecar, source: str, hashes: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Fetch and replay each prefix in order (one at a time: warming must not swamp the engine)."""
    assert sidecar.session is not None
    own = local_url(sidecar.config.host, sidecar.config.port)
    results: dict[str, dict[str, Any]] = {}
    for sid in hashes:
        try:
            results[sid] = await _warm_one(sidecar.session, sidecar, source, own, sid)
        # RecursionError: a source answering JSON nested too deeply (json gives up); not a 500 here
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, RecursionError) as exc:
            results[sid] = {"status": "failed", "error": f"{exc.__class__.__name__}: {exc}"[:300]}
    return results


async def _warm_one(
    session: aiohttp.ClientSession, sidecar: Sidecar, source: str, own: str, sid: str
) -> dict[str, Any]:
    # a control route on the source (it answers with a client's kept request): this sidecar's token
    async with session.get(
        f"{source}/prefixfleet/prefix/{sid}",
        headers=sidecar.peer_control_headers(),
        timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S),
    ) as resp:
        if resp.status == 404:
            return {"status": "failed", "error": f"source {source} does not hold prefix {sid}"}
        if resp.status == 401:
            said = error_message(await resp.read()) or "no reason given"
            return {"status": "failed", "error": f"source {source} refused this sidecar's token: {said}"}
        if resp.status != 200:
            return {"status": "failed", "error": f"source {source} answered HTTP {resp.status}"}
        prefix = await resp.json(content_type=None)
    if not isinstance(prefix, dict):
        return {"status": "failed", "error": f"source {source} answered no JSON object for {sid}"}
    mine = (sidecar.s.engine.model, sidecar.s.engine.revision, sidecar.config.adapter)
    theirs = (prefix.get("model", ""), prefix.get("revision", ""), prefix.get("adapter", ""))
    if sidecar.s.engine.known and theirs != mine:
        return {"status": "failed", "error": f"cache identity differs: source {theirs}, this replica {mine}"}
    adapter = prefix.get("lora_adapter")
    if adapter is not None and (not isinstance(adapter, str) or adapter not in sidecar.s.engine.adapters):
        # replayed here it would be cached under another identity (or refused): useless blocks
        return {
            "status": "failed",
            "error": f"the prefix is cached under LoRA adapter {str(adapter)[:140]!r}, "
            "which this replica's engine has not loaded",
        }
    exemplar = prefix.get("request")
    if exemplar is None:
        # the source's mirror ids are its word tokenizer's, not the engine's: never replayed
        return {"status": "failed", "error": f"no request holding this prefix is kept on the source {source}"}
    num_tokens = prefix.get("num_tokens")
    if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 0:
        return {"status": "failed", "error": f"source {source} sent no token count for {sid}"}
    engine = sidecar.s.engine
    path, body = prefill_request(engine.api, exemplar, engine.served_model)  # ValueError: bad exemplar
    # through this sidecar's own route, which forwards a request's headers: the sidecar's engine key
    # rides along as a client's own would (the fetch from the source above never carries it)
    async with session.post(
        f"{own}{path}",
        json=body,
        headers=sidecar.engine_headers,
        timeout=aiohttp.ClientTimeout(total=PREFILL_TIMEOUT_S),
    ) as resp:
        data = await resp.read()
        if resp.status != 200:
            return {"status": "failed", "error": f"prefill answered HTTP {resp.status}: {data[:200]!r}"}
    return {"status": "ok", "tokens": num_tokens, "cached_before": find_cached_tokens(data) or 0}


# Fields that would make a replay stream, sample several answers, return log-probabilities or
# decode more than needed: dropped (their defaults are a single non-streamed answer).
_OPENAI_DROPPED = (
    "stream",
    "stream_options",
    "n",
    "best_of",
    "use_beam_search",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "echo",
    "min_tokens",
    "max_completion_tokens",
    "suffix",
)
_GENERATE_DROPPED = (
    "stream",
    "rid",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "token_ids_logprob",
    "return_text_in_logprobs",
    "return_hidden_states",
)
_SAMPLING_DROPPED = ("n", "min_new_tokens", "max_new_tokens")


def prefill_request(api: str, exemplar: Any, served_model: str) -> tuple[str, dict[str, Any]]:
    """The route and body that make an engine speaking ``api`` prefill (and cache) the prompt of
    ``exemplar`` (a source's kept request, ``{"path": ..., "body": {...}}``) in the same cache
    namespace, cheaply. Raises ValueError naming what is wrong with the exemplar.

    The body is the client's own (text, chat messages, or the client's token ids: the engine's), so
    the engine tokenizes and templates it as it did on the source: the warmed blocks are the real
    ones. ``cache_salt`` (the tenant's namespace) and everything shaping the prompt (a chat's tools,
    the model) are kept; what would stream, sample several answers or decode is dropped:

    * SGLang ``/generate``: ``max_new_tokens: 0``, a prefill and nothing generated;
    * OpenAI routes: ``max_tokens: 1``, as vLLM's ``SamplingParams`` refuses fewer
      (``_verify_args``; 0 passes only with ``echo``) and SGLang's OpenAI adapter answers a
      completion with at least one token;
    * a ``/generate`` exemplar replayed on a vLLM engine (which has no ``/generate``) becomes a
      ``/v1/completions`` with its ``text`` or ``input_ids`` as ``prompt`` (``model``: the served one).
    """
    if not isinstance(exemplar, dict):
        raise ValueError("the source's kept request is not a JSON object")
    path, given = exemplar.get("path"), exemplar.get("body")
    if path not in GENERATE_PATHS:
        raise ValueError(f"the source's kept request has no generation route: {str(path)[:80]!r}")
    if not isinstance(given, dict):
        raise ValueError("the source's kept request has no JSON object body")
    body = dict(given)
    if path == "/generate":
        for name in _GENERATE_DROPPED:
            body.pop(name, None)
        sampling = body.get("sampling_params")
        if sampling is not None and not isinstance(sampling, dict):  # a batch's list: never kept
            raise ValueError("the source's kept /generate request has no single sampling_params object")
        kept = {k: v for k, v in (sampling or {}).items() if k not in _SAMPLING_DROPPED}
        if api != VLLM:
            body["sampling_params"] = {**kept, "max_new_tokens": 0}
            return path, body
        prompt = body.get("text") if body.get("text") is not None else body.get("input_ids")
        path, body = "/v1/completions", {"prompt": prompt, "max_tokens": 1}
        if given.get("cache_salt") is not None:
            body["cache_salt"] = given["cache_salt"]
        if served_model:
            body["model"] = served_model  # older vLLM requires it
        return path, body
    for name in _OPENAI_DROPPED:
        body.pop(name, None)
    body["max_tokens"] = 1
    return path, body


def add_routes(app: web.Application, expect_handler: ExpectHandler | None = None) -> None:
    """Register the pre-warm endpoints (before the sidecar's catch-all proxy route); the POST with
    the sidecar's ``expect_handler`` (:func:`~.proxying.expect_within_limit`)."""
    app.router.add_get("/prefixfleet/prefix/{hash}", handle_prefix)
    app.router.add_post("/prefixfleet/warm", handle_warm, expect_handler=expect_handler)


def warm_sources(
    subtree_ids: Sequence[str],
    subtrees: Sequence[SubtreeObservation],
    sidecar_urls: Mapping[str, str],
    exclude: str = "",
) -> dict[str, list[str]]:
    """Group the subtrees to warm by a holder's sidecar URL (the first reachable holder of each)."""
    holders = {s.subtree_id: sorted(s.holders) for s in subtrees}
    out: dict[str, list[str]] = {}
    for sid in subtree_ids:
        source = next(
            (sidecar_urls[h] for h in holders.get(sid, []) if h != exclude and h in sidecar_urls), None
        )
        if source is not None:
            out.setdefault(source, []).append(sid)
    return out


@dataclass(frozen=True, slots=True)
class WarmOutcome:
    """What warming one replica achieved: prefilled tokens, prefixes warmed (``ok``) and not
    (``failed``), and ``errors``: (source URL, why) for each warm request that got no usable answer."""

    warmed_tokens: int = 0
    ok: int = 0
    failed: int = 0
    errors: tuple[tuple[str, str], ...] = ()


async def warm_replica(
    http: httpx.AsyncClient,
    url: str,
    subtree_ids: Sequence[str],
    subtrees: Sequence[SubtreeObservation],
    sidecar_urls: Mapping[str, str],
    *,
    exclude: str,
    hold_traffic: bool,
    timeout_s: Callable[[], float],
    control_token: str | None = None,
) -> WarmOutcome:
    """Warm the replica whose sidecar is at ``url`` with ``subtree_ids``: one ``/prefixfleet/warm``
    request per holder (see :func:`warm_sources`; ``exclude`` is the target's own name), in turn.
    ``hold_traffic``: the target is out of rotation while it warms (a new replica, not serving yet);
    false for an existing replica, which keeps serving (its warm-up queues with its traffic).

    ``timeout_s`` gives each request's timeout as it is sent (a caller with an overall deadline
    returns what is left of it). ``control_token``: the fleet's (:mod:`.control`), sent as its header.
    A request that fails or answers other than 200 with a JSON object
    counts all its prefixes failed and adds an entry to ``errors`` (the caller decides how to log it).
    """
    warmed, ok, failed = 0, 0, 0
    errors: list[tuple[str, str]] = []
    for source, sids in warm_sources(subtree_ids, subtrees, sidecar_urls, exclude=exclude).items():
        try:
            result = await _request_warm(http, url, source, sids, hold_traffic, timeout_s(), control_token)
        except (httpx.HTTPError, ValueError) as exc:
            errors.append((source, f"{exc.__class__.__name__}: {exc}"[:300]))
            failed += len(sids)
            continue
        warmed += int(result.get("warmed_tokens", 0))
        succeeded = sum(1 for r in (result.get("results") or {}).values() if r.get("status") == "ok")
        ok += succeeded
        failed += len(sids) - succeeded
    return WarmOutcome(warmed, ok, failed, tuple(errors))


async def _request_warm(
    http: httpx.AsyncClient,
    url: str,
    source: str,
    sids: Sequence[str],
    hold_traffic: bool,
    timeout_s: float,
    control_token: str | None,
) -> dict[str, Any]:
    """The target's answer to one warm request; ValueError when it is not a 200 with a JSON object."""
    body = {"source": source, "hashes": list(sids), "hold_traffic": hold_traffic}
    headers = control_headers(control_token) if control_token else None
    resp = await http.post(f"{url}/prefixfleet/warm", json=body, timeout=timeout_s, headers=headers)
    if resp.status_code != 200:
        raise ValueError(f"{url} answered HTTP {resp.status_code}: {resp.text[:200]}")
    result = resp.json()
    if not isinstance(result, dict):
        raise ValueError(f"{url} answered no JSON object")
    return result
