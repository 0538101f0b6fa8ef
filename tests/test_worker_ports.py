"""Ports the tests pick (fleet_fixtures.free_port, the kubelet shim's pod ports) come from a block of
their own per pytest-xdist worker, below the kernel's ephemeral range: `make test` runs the suite on
several workers at once, and two workers handing out the same port (or an outgoing connection taking
one between picking and binding it) would fail a test at random."""

from __future__ import annotations

import itertools
import socket

import pytest
from fleet_fixtures import LOOPBACK, PORT_RANGE, PortPicker, free_port, worker_port_block

LINUX_EPHEMERAL_LOW = 32768  # net.ipv4.ip_local_port_range's default low end


@pytest.mark.parametrize("workers", [2, 3, 4, 7])
def test_each_worker_has_its_own_block_below_the_ephemeral_range(workers: int) -> None:
    blocks = [worker_port_block(f"gw{n}", workers) for n in range(workers)]
    ports = [port for block in blocks for port in block]
    assert len(ports) == len(set(ports)), "two workers share a port"
    assert all(len(block) >= 1000 for block in blocks)
    assert PORT_RANGE[0] <= min(ports) and max(ports) < PORT_RANGE[1] <= LINUX_EPHEMERAL_LOW


def test_without_xdist_the_whole_range_is_used() -> None:
    assert worker_port_block(None, 1) == range(*PORT_RANGE)
    assert worker_port_block("gw0", 1) == range(*PORT_RANGE)


@pytest.mark.parametrize("worker", ["gw2", "master", "gw", "gw-1"])
def test_a_worker_name_outside_the_count_is_refused_by_name(worker: str) -> None:
    with pytest.raises(ValueError, match=f"worker '{worker}' is not one of gw0..gw1"):
        worker_port_block(worker, 2)


def test_ports_are_handed_out_without_repeats() -> None:
    block = range(PORT_RANGE[0], PORT_RANGE[0] + 200)
    picker = PortPicker(block)
    picked = [picker() for _ in range(50)]
    assert len(set(picked)) == 50 and all(port in block for port in picked)


def test_a_port_in_use_is_skipped_and_a_full_block_is_an_error() -> None:
    port = free_port()
    with socket.socket() as held:
        held.bind((LOOPBACK, port))
        held.listen()
        with pytest.raises(RuntimeError, match=f"no free port on {LOOPBACK} among 1 \\({port}..{port}\\)"):
            PortPicker([port])()
        other = free_port()
        picker = PortPicker([port, other])
        assert [picker(), picker()] == [other, other]


def test_picks_are_not_a_sweep_that_another_run_on_the_same_block_could_follow() -> None:
    """Two suites on one machine both have a gw0 with the same block: ports handed out in turn from
    a random start let one run's picks trail the other's and take its ports before they were bound
    (an operator's liveness port, in a run beside another suite)."""
    block = range(PORT_RANGE[0], PORT_RANGE[0] + 1000)
    picker = PortPicker(block)
    picks = [picker() for _ in range(20)]
    steps = {(later - earlier) % len(block) for earlier, later in itertools.pairwise(picks)}
    assert steps != {1}, f"ports handed out in turn: {picks}"
