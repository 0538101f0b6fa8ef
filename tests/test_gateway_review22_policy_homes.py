"""Where affinity sends a prefix nobody holds, and where round robin starts.

affinity sent a new prefix to ``crc32(head) % len(replicas)``: a list index. Every gateway lists the
replicas in the order it first saw them, so two gateways sent the same new prefix to different
replicas, and a replica joining or leaving moved nearly every new prefix (4 of 5 with 4 -> 5
replicas). Now rendezvous hashing (``affinity.home``): order-independent, and a join moves only the
prefixes the new replica wins.

round_robin started every instance at the list's first replica: every gateway sent its first
request to the same worker, and gateways a client alternates between (as ``prefixfleet up`` and the
simulator do) stepped in lockstep, each replica getting requests in pairs. Now each instance starts
at an offset hashed from its first request's time (deterministic for the simulator).
"""

from __future__ import annotations

import hashlib
import struct

import pytest

from prefixfleet.router.policies import ReplicaState, RouteRequest, make_policy
from prefixfleet.router.policies.affinity import home
from prefixfleet.router.policies.base import rendezvous, tie_break
from prefixfleet.router.radix import as_token_bytes

pytestmark = pytest.mark.timeout(60)
PREFIXES = 400


def new_prefix(i: int, now: float = 0.0) -> RouteRequest:
    tokens = [i * 7919 + k for k in range(40)]
    return RouteRequest(as_token_bytes(tokens), len(tokens), now=now)


def fleet(ids: list[str]) -> list[ReplicaState]:
    return [ReplicaState(rid) for rid in ids]


def test_affinity_sends_a_new_prefix_to_the_same_replica_whatever_the_list_order() -> None:
    policy = make_policy("affinity")
    ids = ["w0", "w1", "w2", "w3"]
    for i in range(PREFIXES):
        one = policy.choose(new_prefix(i), fleet(ids)).replica_id
        other = policy.choose(new_prefix(i), fleet(ids[::-1])).replica_id
        assert one == other, f"prefix {i}: {one} from one gateway, {other} from another"


def test_a_replica_joining_moves_only_the_new_prefixes_it_takes() -> None:
    policy = make_policy("affinity")
    before = [
        policy.choose(new_prefix(i), fleet(["w0", "w1", "w2", "w3"])).replica_id for i in range(PREFIXES)
    ]
    after = [
        policy.choose(new_prefix(i), fleet(["w0", "w1", "w2", "w3", "w4"])).replica_id
        for i in range(PREFIXES)
    ]
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert all(a == "w4" for _, a in moved)  # only to the newcomer
    assert 0.1 < len(moved) / PREFIXES < 0.3  # about its fair share (1/5), not 4/5
    # and new prefixes still spread over every replica
    assert set(after) == {"w0", "w1", "w2", "w3", "w4"}


def test_round_robin_instances_do_not_all_start_at_the_first_replica() -> None:
    replicas = fleet(["w0", "w1", "w2", "w3"])
    firsts = [
        make_policy("round_robin").choose(new_prefix(0, now=1.7e9 + g * 0.37), replicas).replica_id
        for g in range(100)
    ]
    assert set(firsts) == {"w0", "w1", "w2", "w3"}


def test_two_round_robin_gateways_a_client_alternates_between_do_not_step_in_lockstep() -> None:
    replicas = fleet(["w0", "w1", "w2", "w3"])
    paired = 0
    for pair in range(100):
        gateways = [make_policy("round_robin"), make_policy("round_robin")]
        t0 = 1.7e9 + pair
        picks = [
            gateways[i % 2].choose(new_prefix(i, now=t0 + i * 0.01), replicas).replica_id for i in range(8)
        ]
        # lockstep: requests 2k and 2k+1 (one per gateway) go to the same replica every time
        paired += all(picks[k] == picks[k + 1] for k in range(0, 8, 2))
    assert paired < 50  # started apart, most pairs of gateways spread their requests


def test_round_robin_still_rotates_through_every_replica() -> None:
    policy = make_policy("round_robin")
    replicas = fleet(["w0", "w1", "w2"])
    picks = [policy.choose(new_prefix(0, now=5.0 + i), replicas).replica_id for i in range(6)]
    assert sorted(picks[:3]) == ["w0", "w1", "w2"] and picks[3:] == picks[:3]


def test_affinity_homes_and_tie_breaks_share_one_rendezvous_hash_with_unchanged_picks() -> None:
    # affinity.home and base.tie_break rank replicas by one helper (they had a copy each); the picks
    # are those of the formula both used: blake2b(seed + id, 8 bytes), the highest wins
    def by_formula(seed: bytes, replicas: list[ReplicaState]) -> object:
        return max(
            replicas, key=lambda r: hashlib.blake2b(seed + str(r.replica_id).encode(), digest_size=8).digest()
        )

    replicas = fleet(["w0", "w1", "w2", "w3", "w4"])
    for i in range(PREFIXES):
        request = new_prefix(i, now=1.7e9 + i * 0.37)
        head, when = request.tokens[:64], struct.pack("<d", request.now)
        assert rendezvous(head, replicas) is home(request, replicas) is by_formula(head, replicas)
        assert rendezvous(when, replicas) is tie_break(request, replicas) is by_formula(when, replicas)
        assert rendezvous(head, replicas[::-1]) is rendezvous(head, replicas)
