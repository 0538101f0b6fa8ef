"""The operator killed (SIGKILL) and restarted over and over while the fleet's spec keeps changing.

Runs in the emulated cluster of ``tests/test_operator_e2e.py`` (its fixtures: kmock API server with
the kubelet shim, a real Valkey, ``prefixfleet operator run`` as a process). Every kill lands at a
random point of a reconcile triggered by a ``kubectl scale``.

Specification: no two pods ever serve the same replica slot, the pod count never exceeds the largest
requested size plus the surge of one, and once the restarts stop the fleet converges to exactly the
last requested size — every pod owned by the fleet (no orphans), status Ready with the right counts,
and the members in Redis exactly the pods.

``PREFIXFLEET_CHAOS_OPERATOR_KILLS`` sets the number of kills (6 by default keeps the suite fast; the
reliability figure uses 20).
"""

from __future__ import annotations

import os
import random
import re
import time
from pathlib import Path

import pytest

from tests import test_operator_e2e as e2e
from tests.k8s.cluster import EmulatedCluster, wait_for
from tests.test_operator_e2e import FLEET, OperatorProcess, converged, fleet_manifest, members, pods

pytestmark = pytest.mark.slow

# the e2e module's fixtures, registered here by name
fleet_env = e2e.fleet_env
redis_url = e2e.redis_url

SIZES = (4, 2, 3, 1, 3)


@pytest.mark.timeout(600)
def test_operator_killed_repeatedly_during_scaling_leaves_no_duplicates_or_orphans(
    fleet_env: tuple[EmulatedCluster, OperatorProcess], redis_url: str, tmp_path: Path
) -> None:
    cluster, operator = fleet_env
    cluster.apply(fleet_manifest(tmp_path / "fleet.yaml", replicas=2))
    rng = random.Random(20261130)
    kills = int(os.environ.get("PREFIXFLEET_CHAOS_OPERATOR_KILLS", "6"))
    wanted, largest, most_seen = 2, 2, 0
    for k in range(kills):
        if k % 2 == 0:
            wanted = SIZES[(k // 2) % len(SIZES)]
            largest = max(largest, wanted)
            cluster.kubectl("scale", f"pcf/{FLEET}", f"--replicas={wanted}")
        time.sleep(rng.uniform(0.3, 2.5))  # somewhere inside the reconcile the scale triggered
        operator.kill()
        names = [p["metadata"]["name"] for p in pods(cluster)]
        assert len(names) == len(set(names))
        most_seen = max(most_seen, len(names))
        operator.start()
    assert most_seen <= largest + 1, f"{most_seen} pods at once for at most {largest} replicas + surge 1"
    status = wait_for(lambda: converged(cluster, wanted), 120, what=f"convergence to {wanted} replicas")
    assert status["readyReplicas"] == wanted
    names = sorted(p["metadata"]["name"] for p in pods(cluster))
    assert len(names) == wanted and all(re.fullmatch(rf"{FLEET}-replica-\d+", n) for n in names)
    uid = cluster.kubectl_json("get", "pcf", FLEET)["metadata"]["uid"]
    for pod in pods(cluster):
        assert [ref["uid"] for ref in pod["metadata"]["ownerReferences"]] == [uid]
    wait_for(lambda: sorted(members(redis_url)) == names, 30, what="Redis membership to equal the pods")
