from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s.cluster import EmulatedCluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmulatedCluster]:
    c = EmulatedCluster(tmp_path / "cluster")
    try:
        yield c
    finally:
        c.close()
