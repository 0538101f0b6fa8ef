"""A local Prometheus whose port another Prometheus already serves is refused, not taken for ready.

Before, ``LocalPrometheus.start()`` polled ``/-/ready`` on its port: when another run's Prometheus
(or the user's own, for ``--port 9090``) was listening there, that one answered 200 within
milliseconds, start() returned, and the new process died a moment later on "address already in
use" -- every query then read the other Prometheus's data. start() now checks that the server
answering is the one it started (its ``--config.file``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fleet_fixtures import free_port

from prefixfleet.observability.local_prometheus import LocalPrometheus, scrape_config

pytestmark = pytest.mark.timeout(120)


def test_a_port_already_served_by_another_prometheus_is_refused_naming_the_port(tmp_path: Path) -> None:
    port = free_port()
    config = scrape_config([], fleet="f")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with LocalPrometheus(tmp_path / "a", port, config) as first:
        second = LocalPrometheus(tmp_path / "b", port, config)
        try:
            with pytest.raises(RuntimeError, match=f"port {port}"):
                second.start()
            assert second.proc is None, "the refused Prometheus was left running"
        finally:
            second.stop()
        # the first one is untouched and still answers as itself
        flags = first.api("status/flags")["data"]
        assert flags["config.file"] == str(first.config_path)
