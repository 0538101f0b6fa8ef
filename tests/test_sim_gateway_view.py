"""What routing policies see of a simulated ``batched`` replica: a gateway's view, not the engine's.

With ``cache_on_compute`` the engine's tree holds computed tokens only, but a gateway matches a
request against the sidecar's mirror, where every prompt routed there is inserted when it is routed
(in whole hash blocks). By default the engine inserts the whole prompt at admission, and its own
tree is the view. Virtual clocks only: no I/O, no wall time.
"""

from __future__ import annotations

import functools
import math

import pytest
from sim_replicas import batched_replica

from prefixfleet.router.blockhash import DEFAULT_BLOCK_TOKENS
from prefixfleet.router.policies import RouteRequest
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.sim.engine import BatchedReplica, Job

batched = functools.partial(batched_replica, capacity=4_000)


def route(rep: BatchedReplica, job: Job, now: float) -> int:
    """Route ``job`` to ``rep`` as the simulator does: its uncached estimate comes from the view."""
    view = rep.view(RouteRequest(tokens=job.tokens, num_tokens=job.total, now=now))
    job.est_uncached = job.total - view.matched_tokens
    rep.accept(job, now)
    return view.matched_tokens


def drain(rep: BatchedReplica, now: float) -> None:
    for _ in range(10_000):
        t = rep.next_event_s()
        if t is None:
            return
        rep.on_event(t)
    raise AssertionError("replica still busy")


def test_a_prefix_routed_but_not_computed_yet_is_matched_in_whole_blocks():
    rep = batched(True)
    prompt = as_token_bytes(range(1, 501))  # 500 new tokens: three 200-token steps
    first = Job(0, 0.0, prompt, 3)
    assert route(rep, first, 0.0) == 0

    second = Job(1, 0.001, prompt + as_token_bytes([9999]), 3)
    assert rep.tree.matched_tokens(second.tokens) == 0  # the engine has computed none of it
    matched = route(rep, second, 0.001)
    assert matched == 500 - 500 % DEFAULT_BLOCK_TOKENS  # the gateway counts the first send
    assert second.est_uncached == second.total - matched

    drain(rep, 0.001)
    assert second.matched == 400  # what the engine found computed when its prefill began
    assert math.isfinite(second.ttft_s) and rep._waiting_uncached == 0


def test_a_prompt_longer_than_the_cache_is_matched_as_far_as_it_fits():
    rep = batched(True, capacity=300)
    prompt = as_token_bytes(range(1, 501))
    route(rep, Job(0, 0.0, prompt, 1), 0.0)
    view = rep.view(RouteRequest(tokens=prompt, num_tokens=500, now=0.0))
    assert view.matched_tokens == 288 and view.cached_tokens == 300 and view.capacity_tokens == 300


@pytest.mark.parametrize("cache_on_compute", [False, True])
def test_a_computed_prefix_is_matched_in_both_modes(cache_on_compute):
    rep = batched(cache_on_compute)
    prompt = as_token_bytes(range(1, 501))
    route(rep, Job(0, 0.0, prompt, 1), 0.0)
    drain(rep, 0.0)
    view = rep.view(RouteRequest(tokens=prompt + as_token_bytes([7]), num_tokens=501, now=1.0))
    # default: the engine's own tree, token-exact; cache_on_compute: the mirror, in whole blocks
    assert view.matched_tokens == (496 if cache_on_compute else 500)
    assert rep.tree.matched_tokens(prompt) == 500


def test_the_wait_shown_for_a_prefix_still_being_computed_covers_its_computation():
    # The engine serves prefill chunks in admission order: a request routed onto a prefix another
    # request is computing waits behind it, and the replica's pending prefill (which the view's
    # wait counts) holds that computation. So the match does not hide the wait.
    rep = batched(True)
    prompt = as_token_bytes(range(1, 501))
    first = Job(0, 0.0, prompt, 3)
    route(rep, first, 0.0)
    second = Job(1, 0.001, prompt + as_token_bytes([9999]), 3)
    view = rep.view(RouteRequest(tokens=second.tokens, num_tokens=second.total, now=0.001))
    shown_miss_s = (second.total - view.matched_tokens) * rep.config.prefill_s_per_token
    route(rep, second, 0.001)
    drain(rep, 0.001)

    assert first.arrival_s + first.ttft_s <= second.arrival_s + second.ttft_s
    assert second.ttft_s <= view.wait_s + shown_miss_s
