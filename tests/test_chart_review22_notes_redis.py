"""What `helm install` prints about the fleets' default Redis is what the operator will use.

values.yaml offers operator.extraEnv for PREFIXFLEET_REDIS_URL ("e.g. from a Secret:
valueFrom.secretKeyRef", a default Redis URL holding a password kept out of the Deployment), and the
operator's environment then takes that entry instead of the chart's. NOTES.txt ignored it: without
the chart's Redis it told the user there was no default Redis and to give every fleet spec.redis
(the examples rely on the default), and with `redis.enabled=true` it named the chart's Redis, which
the operator no longer uses. Specification: the NOTES name the source the operator reads (the Secret
and key, or operator.extraEnv), never print an extraEnv URL (it may hold a password), and say there
is no default only when the operator gets none.
"""

from __future__ import annotations

from typing import Any

import helm_python
import pytest
from chart_fixtures import CHART, NAMESPACE, RELEASE, render

CHART_REDIS = f"redis://prefixfleet-redis.{NAMESPACE}.svc:6379/0"
NO_DEFAULT = "No default Redis"
SECRET_REF = {"secretKeyRef": {"name": "redis-default", "key": "url"}}
SECRET = {"name": "PREFIXFLEET_REDIS_URL", "valueFrom": SECRET_REF}
PLAIN = {"name": "PREFIXFLEET_REDIS_URL", "value": "redis://:s3cret@redis.data.svc:6379/0"}


def notes_and_env(values: dict[str, Any]) -> tuple[str, dict[str, dict[str, Any]]]:
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE)
        (operator,) = [
            o
            for o in render(chart, values)
            if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-operator")
        ]
    (text,) = [t for path, t in rendered.items() if path.endswith("NOTES.txt")]
    (container,) = operator["spec"]["template"]["spec"]["containers"]
    return " ".join(text.split()), {e["name"]: e for e in container["env"]}


@pytest.mark.parametrize("redis_enabled", [False, True], ids=["no-chart-redis", "chart-redis"])
def test_a_default_redis_url_from_a_secret_is_named_by_its_secret(redis_enabled: bool) -> None:
    text, env = notes_and_env({"redis": {"enabled": redis_enabled}, "operator": {"extraEnv": [SECRET]}})
    assert env["PREFIXFLEET_REDIS_URL"] == SECRET  # what the operator reads
    assert NO_DEFAULT not in text
    assert CHART_REDIS not in text
    assert f"Fleets without spec.redis use the Redis URL in Secret {NAMESPACE}/redis-default, key url" in text


@pytest.mark.parametrize("redis_enabled", [False, True], ids=["no-chart-redis", "chart-redis"])
def test_a_default_redis_url_written_in_extra_env_is_said_but_not_printed(redis_enabled: bool) -> None:
    text, env = notes_and_env({"redis": {"enabled": redis_enabled}, "operator": {"extraEnv": [PLAIN]}})
    assert env["PREFIXFLEET_REDIS_URL"] == PLAIN
    assert NO_DEFAULT not in text and CHART_REDIS not in text
    assert "s3cret" not in text and "redis.data.svc" not in text
    assert "Fleets without spec.redis use the Redis URL operator.extraEnv gives PREFIXFLEET_REDIS_URL" in text


def test_an_empty_extra_env_url_leaves_the_operator_without_a_default() -> None:
    entry = {"name": "PREFIXFLEET_REDIS_URL", "value": ""}
    text, env = notes_and_env({"redis": {"enabled": True}, "operator": {"extraEnv": [entry]}})
    assert env["PREFIXFLEET_REDIS_URL"] == entry
    assert NO_DEFAULT in text and CHART_REDIS not in text


SAME_AS_BEFORE = {
    "chart redis": ({"redis": {"enabled": True}}, f"Fleets without spec.redis use {CHART_REDIS}."),
    "a default URL": (
        {"operator": {"defaultRedisUrl": "redis://r.data.svc:6379/0"}},
        "Fleets without spec.redis use redis://r.data.svc:6379/0.",
    ),
    "none": ({}, f"{NO_DEFAULT}: give every fleet spec.redis.url or spec.redis.secretRef"),
    "other extra env": (
        {"redis": {"enabled": True}, "operator": {"extraEnv": [{"name": "X", "value": "1"}]}},
        f"Fleets without spec.redis use {CHART_REDIS}.",
    ),
}


@pytest.mark.parametrize(("values", "said"), SAME_AS_BEFORE.values(), ids=SAME_AS_BEFORE.keys())
def test_without_an_extra_env_url_the_notes_name_the_chart_default(values: dict[str, Any], said: str) -> None:
    text, env = notes_and_env(values)
    assert said in text
    url = env.get("PREFIXFLEET_REDIS_URL", {}).get("value")
    assert (url is None) == (NO_DEFAULT in text)
    if url is not None:
        assert url in said


def test_a_value_from_that_is_no_object_is_refused_by_name_not_by_a_template_error() -> None:
    entry = {"name": "PREFIXFLEET_REDIS_URL", "valueFrom": "redis-default"}
    with helm_python.Chart.load(CHART) as chart, pytest.raises(helm_python.HelmValuesError) as err:
        chart.render({"operator": {"extraEnv": [entry]}}, name=RELEASE, namespace=NAMESPACE)
    assert "/operator/extraEnv/0/valueFrom" in str(err.value)


def test_a_value_from_other_than_a_secret_is_said_without_naming_one() -> None:
    entry = {"name": "PREFIXFLEET_REDIS_URL", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "url"}}}
    text, _ = notes_and_env({"operator": {"extraEnv": [entry]}})
    assert "Fleets without spec.redis use the Redis URL operator.extraEnv gives PREFIXFLEET_REDIS_URL" in text
    assert NO_DEFAULT not in text and "Secret" not in text.split("Create a fleet")[0]
