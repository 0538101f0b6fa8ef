"""A sidecar without Redis keeps its mirror's block index the size of its tree.

The mirror's block index (the summary's hashes, kept as prompts come and go) forgets the nodes
the tree evicted when a summary is built. A sidecar without ``--redis`` ("omit to only proxy")
never builds one, so its index kept every node ever evicted, with its block hashes: memory growing
with every request served, for as long as the sidecar ran. The mirror now prunes the index once
the evictions outnumber the tree's nodes.

Real HTTP on 127.0.0.1 for the sidecar case: a stand-in engine answering every ``/generate``, the
real sidecar (``listening``, no Redis) with a 2000-token mirror.
"""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from fleet_fixtures import LOOPBACK, serve_aiohttp, standalone_sidecar
from stand_in_engine import stand_in_engine

from prefixfleet.router import mirror as mirror_module
from prefixfleet.router.blockhash import CacheIdentity
from prefixfleet.router.mirror import CacheMirror
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.sidecar import listening
from prefixfleet.router.summary import build_summary

pytestmark = pytest.mark.timeout(120)
PRUNE_MIN_EVICTIONS = 64


def bound(mirror: CacheMirror) -> int:
    """The most nodes the index may hold: the tree's, plus the evictions not yet pruned."""
    return max(mirror_module._PRUNE_MIN_EVICTIONS, mirror.tree.node_count) + mirror.tree.node_count + 1


def test_a_mirror_never_summarised_keeps_its_index_bounded() -> None:
    mirror = CacheMirror(2000, CacheIdentity("m", "r"), block_tokens=16, clock=lambda: 0.0)
    for i in range(20 * mirror_module._PRUNE_MIN_EVICTIONS):
        mirror.admit_sent(as_token_bytes([i, *range(1, 100)]), None)
    assert len(mirror.index) <= bound(mirror)
    # what it dropped it dropped right: the summary equals a rebuild's
    fresh, _ = build_summary(
        mirror.tree, worker="w", version=1, now=0.0, identity_seed=mirror.identity_seed, block_tokens=16,
        namespace_seed=mirror.namespace_seed, wall_time_of=mirror.wall_time_of,
    )  # fmt: skip
    assert mirror.summary(worker="w", version=1) == fresh


async def test_a_sidecar_without_redis_keeps_its_index_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    async def generate(_request: web.Request) -> web.Response:
        return web.json_response({"text": "", "meta_info": {}})

    monkeypatch.setattr(mirror_module, "_PRUNE_MIN_EVICTIONS", PRUNE_MIN_EVICTIONS)  # fewer requests
    requests = 3 * PRUNE_MIN_EVICTIONS
    async with (
        serve_aiohttp(stand_in_engine({"/generate": generate})) as engine,
        listening(standalone_sidecar(engine, cache_tokens=2000)) as served,
        aiohttp.ClientSession() as http,
    ):
        url = f"http://{LOOPBACK}:{served.port}/generate"
        for i in range(requests):
            body = {"input_ids": [i, *range(1, 100)], "sampling_params": {"max_new_tokens": 1}}
            async with http.post(url, json=body) as resp:
                assert resp.status == 200
        mirror = served.sidecar.s.mirror
        assert mirror.tree.evictions_total >= requests - 20
        assert len(mirror.index) <= bound(mirror)
