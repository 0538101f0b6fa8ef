"""The CRD tells whoever writes ``spec.redis.url`` (kubectl explain, an IDE reading the schema) that a
password in it is exposed, and where a password belongs instead, before the operator's Warning does.

Read from the committed CRDs (crds/ and the chart's copy, which test_crd.py keeps equal to what the
models generate), so what users install is what is checked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from prefixfleet.operator import models
from prefixfleet.operator.crd import crd_paths
from prefixfleet.operator.planner import REDIS_PASSWORD_IN_SPEC

ROOT = Path(__file__).resolve().parents[1]


def redis_properties(path: Path) -> dict[str, dict[str, object]]:
    (version,) = yaml.safe_load(path.read_text())["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec["properties"]["redis"]["properties"]


@pytest.mark.parametrize("path", crd_paths(ROOT), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_url_description_says_a_password_there_is_exposed_and_where_it_belongs(path: Path) -> None:
    redis = redis_properties(path)
    description = str(redis["url"]["description"])
    # the two ways a URL carries a password (planner.url_has_password reads both)
    assert "user:pw@" in description and "?password=" in description, description
    # who can read it: the fleet itself, and the pods/Deployment it is copied into
    assert "PrefixCacheFleets" in description and "pods" in description, description
    # the Warning it draws, by its reason, so `kubectl get events` can be matched to it
    assert REDIS_PASSWORD_IN_SPEC in description, description
    # the fields to use instead exist in this very schema, under their CRD (camelCase) names
    fields = {models.RedisSpec.model_fields[f].alias for f in ("password_secret_ref", "secret_ref")}
    assert fields <= set(redis), (fields, sorted(redis))
    for name in fields:
        assert f"spec.redis.{name}" in description, (name, description)
