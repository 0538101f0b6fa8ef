"""A Redis password written in ``spec.redis.url`` (or the operator's ``--redis`` default).

Specification:

* such a URL is still accepted (existing fleets keep working on an operator upgrade), but it is
  copied as written into the replica pods' and gateway Deployment's env (REDIS_URL) and the
  Deployment's last-applied annotation, so the fleet says so: one Warning Event
  ``RedisPasswordInSpec`` per fleet generation and a condition ``RedisPasswordExposed=True`` (present
  only while it holds; the fleet is not Degraded for it), naming ``spec.redis.passwordSecretRef`` and
  ``spec.redis.secretRef`` as the fix and never quoting the password (nor the URL);
* ``spec.redis.secretRef`` keeps the URL out of the objects: no warning, whatever its Secret holds;
* ``prefixfleet operator validate`` prints it as a warning line; the exit status stays 0.

Before, nothing said it: the password sat in plain text in every pod's env with the fleet healthy.
The rounds run in-process (``reconcile``) on the emulated API server against a real Valkey/Redis with
``requirepass``, kopf's Event posting replaced by a list, as in tests/test_operator_redis_outage.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from prefixfleet.cli import main
from prefixfleet.operator.handlers import OperatorContext, close_clients, reconcile
from prefixfleet.operator.planner import (
    REDIS_PASSWORD_EXPOSED,
    REDIS_PASSWORD_IN_SPEC,
    redis_password_warning,
    url_has_password,
)
from tests.k8s.cluster import EmulatedCluster, emulator_fleet
from tests.test_operator_redis_auth import PASSWORD, PASSWORD_REF, guarded_redis, password_secret
from tests.test_operator_redis_permissions import NAMESPACE, in_process_kube

__all__ = ["guarded_redis"]  # a fixture: a Valkey/Redis requiring PASSWORD, its URL without it

LOG = logging.getLogger("test_operator_redis_password_in_spec")
FLEET = "exposed"
ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "emulator-fleet.yaml"

# ------------------------------------------------------------------ the detection (pure)


@pytest.mark.parametrize(
    "url",
    [
        "redis://user:pw@redis:6379/0",
        "redis://:pw@redis:6379/0",
        "rediss://fleet:s%2Fcret@redis.example:6380/1",
        "redis://user:pw@[fd00::12]:6379/0",
        "redis://:pw@[fd00::12]/0",
        "unix://:pw@/run/redis/redis.sock?db=0",
        "unix:///run/redis/redis.sock?db=0&password=pw",  # redis-py's from_url reads it too
        "redis://redis:6379/0?password=pw",
    ],
)
def test_a_url_with_a_password_is_detected(url: str) -> None:
    assert url_has_password(url)


@pytest.mark.parametrize(
    "url",
    [
        "redis://redis:6379/0",
        "redis://user@redis:6379/0",  # a user alone: its password comes from passwordSecretRef
        "redis://user:@redis:6379/0",  # an empty password is none
        "rediss://fleet@redis.example:6380/1",
        "redis://[fd00::12]:6379/0",
        "redis://fleet@[fd00::12]:6379/0",
        "unix:///run/redis/redis.sock?db=0",
        "unix://fleet@/run/redis/redis.sock",
        "",
    ],
)
def test_a_url_without_a_password_is_not(url: str) -> None:
    assert not url_has_password(url)


def test_a_url_the_parser_refuses_is_read_without_crashing() -> None:
    assert url_has_password("redis://u:pw@[fd00::12:6379/0")  # unbalanced bracket
    assert not url_has_password("redis://[fd00::12:6379/0")


def test_the_warning_names_the_field_and_the_fix_never_the_password() -> None:
    warning = redis_password_warning({"url": "redis://fleet:hunter2-Secret@redis:6379/0"}, "")
    assert warning.startswith("spec.redis.url holds a password")
    assert "spec.redis.passwordSecretRef" in warning and "spec.redis.secretRef" in warning
    assert "plain text" in warning and "REDIS_URL" in warning
    assert "hunter2" not in warning
    assert "redis://" not in warning and "redis:6379" not in warning  # nor any part of the URL


def test_the_operator_default_is_judged_when_the_spec_names_no_url() -> None:
    default = "redis://:op-Secret@redis:6379/0"
    warning = redis_password_warning({}, default)
    assert warning.startswith("the operator's default Redis URL (--redis")
    assert "op-Secret" not in warning and "spec.redis.secretRef" in warning
    # passwordSecretRef alone does not help: the default URL still goes into the env as written
    assert redis_password_warning({"passwordSecretRef": PASSWORD_REF}, default)
    # the spec's own URL replaces the default
    assert redis_password_warning({"url": "redis://redis:6379/0"}, default) == ""
    # a secretRef's URL is read by the pods from the Secret: never written out
    assert redis_password_warning({"secretRef": {"name": "r", "key": "url"}}, default) == ""
    assert redis_password_warning({}, "redis://redis:6379/0") == ""
    assert redis_password_warning({}, "") == ""


# ------------------------------------------------------------------ reconcile rounds (in-process)


def fleet(redis_spec: dict[str, Any], replicas: int = 1) -> str:
    return emulator_fleet(FLEET, NAMESPACE, redis_spec, replicas=replicas, routers=1)


class Rounds:
    def __init__(self, cluster: EmulatedCluster, ctx: OperatorContext) -> None:
        self.cluster, self.ctx = cluster, ctx
        self.events: list[dict[str, Any]] = []

    async def round(self) -> dict[str, Any]:
        """One reconcile of the fleet; its status."""
        await reconcile(self.ctx, NAMESPACE, FLEET, LOG)
        return (self.ctx.kube.get("PrefixCacheFleet", NAMESPACE, FLEET) or {}).get("status") or {}

    def warnings(self) -> int:
        return sum(
            e.get("type") == "Warning" and e.get("reason") == REDIS_PASSWORD_IN_SPEC for e in self.events
        )


@pytest.fixture
async def rounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Rounds]:
    cluster = EmulatedCluster(tmp_path / "cluster")
    ctx = OperatorContext(kube=None)  # type: ignore[arg-type]
    run = Rounds(cluster, ctx)
    monkeypatch.setattr(kopf, "event", lambda *args, **kwargs: run.events.append(kwargs))
    monkeypatch.setattr(kopf, "info", lambda *args, **kwargs: None)
    try:
        ctx.kube = in_process_kube(cluster)
        cluster.apply(password_secret(PASSWORD))  # the passwordSecretRef Secret, holding PASSWORD
        yield run
    finally:
        memo = kopf.Memo()
        memo.ctx = ctx
        await close_clients(memo=memo)
        cluster.close()


def with_password(url: str) -> str:
    return url.replace("redis://", f"redis://:{PASSWORD}@", 1)


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


async def test_a_password_in_the_url_is_said_once_per_generation_and_never_quoted(
    rounds: Rounds, guarded_redis: str
) -> None:
    url = with_password(guarded_redis)
    rounds.cluster.apply(fleet({"url": url}))
    for _ in range(3):
        status = await rounds.round()
    assert rounds.warnings() == 1  # before: 0; not one per round
    said = conditions(status)
    exposed = said[REDIS_PASSWORD_EXPOSED]
    assert exposed["status"] == "True" and exposed["reason"] == REDIS_PASSWORD_IN_SPEC
    assert "spec.redis.passwordSecretRef" in exposed["message"]
    # accepted and working: the password authenticates, the fleet is not Degraded for it
    assert said["Degraded"]["status"] == "False", said["Degraded"]
    # it is really there, which is what the warning is about
    deployment = rounds.ctx.kube.get("Deployment", NAMESPACE, f"{FLEET}-router") or {}
    assert PASSWORD in json.dumps(deployment)
    # never in what the fleet says
    assert PASSWORD not in json.dumps(rounds.events) and PASSWORD not in json.dumps(status)

    rounds.cluster.apply(fleet({"url": url}, replicas=2))  # a new generation: said once more
    for _ in range(2):
        status = await rounds.round()
    assert rounds.warnings() == 2
    assert conditions(status)[REDIS_PASSWORD_EXPOSED]["observedGeneration"] == 2

    # fixed: the URL without it, the password from its Secret; the condition goes, no new Event
    fixed = {"url": guarded_redis, "passwordSecretRef": PASSWORD_REF}
    rounds.cluster.apply(fleet(fixed, replicas=2))
    for _ in range(2):
        status = await rounds.round()
    assert REDIS_PASSWORD_EXPOSED not in conditions(status)
    assert conditions(status)["Degraded"]["status"] == "False"
    assert rounds.warnings() == 2
    assert PASSWORD not in json.dumps(rounds.events) and PASSWORD not in json.dumps(status)


async def test_the_operator_default_with_a_password_is_said_too(rounds: Rounds, guarded_redis: str) -> None:
    rounds.ctx.default_redis_url = with_password(guarded_redis)
    rounds.cluster.apply(fleet({}))
    for _ in range(2):
        status = await rounds.round()
    assert rounds.warnings() == 1
    assert conditions(status)[REDIS_PASSWORD_EXPOSED]["message"].startswith("the operator's default")
    assert PASSWORD not in json.dumps(rounds.events) and PASSWORD not in json.dumps(status)


async def test_a_url_without_a_password_says_nothing(rounds: Rounds, guarded_redis: str) -> None:
    rounds.cluster.apply(fleet({"url": guarded_redis, "passwordSecretRef": PASSWORD_REF}))
    for _ in range(2):
        status = await rounds.round()
    assert rounds.warnings() == 0
    assert REDIS_PASSWORD_EXPOSED not in conditions(status)
    assert set(conditions(status)) == {"Ready", "Progressing", "Degraded"}


# ------------------------------------------------------------------ prefixfleet operator validate


def _example(tmp_path: Path, redis_spec: dict[str, Any]) -> Path:
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["spec"]["redis"] = redis_spec
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(obj))
    return path


def test_validate_warns_of_a_password_in_the_url_and_still_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _example(tmp_path, {"url": "redis://fleet:hunter2-Secret@redis:6379/0"})
    assert main(["operator", "validate", str(path)]) == 0  # a warning, not a failure
    out = capsys.readouterr().out
    assert f"{path}: emulator-fleet: ok" in out
    assert f"{path}: emulator-fleet: warning: spec.redis.url holds a password" in out  # before: absent
    assert "spec.redis.passwordSecretRef" in out and "hunter2" not in out


def test_validate_says_nothing_more_without_a_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _example(tmp_path, {"url": "redis://fleet@redis:6379/0", "passwordSecretRef": PASSWORD_REF})
    assert main(["operator", "validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ok" in out and "warning" not in out
