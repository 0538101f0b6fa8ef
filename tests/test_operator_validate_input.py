"""`prefixfleet operator validate` on the mistakes a newcomer makes before `kubectl apply`.

A manifest the API server would not take as a PrefixCacheFleet at all (an apiVersion the CRD does
not serve, a misspelt kind of our group) must not read `ok` or be skipped with exit 0, an input
holding no fleet must not pass silently, and broken YAML is one line naming where.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from prefixfleet.cli import main
from prefixfleet.operator import models

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "emulator-fleet.yaml"


def _write(tmp_path: Path, **changes: str) -> Path:
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj.update(changes)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(obj))
    return path


def test_an_api_version_the_crd_does_not_serve_is_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # kubectl apply answers "no matches for kind PrefixCacheFleet in version prefixfleet.io/v1"
    path = _write(tmp_path, apiVersion="prefixfleet.io/v1")
    assert main(["operator", "validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}: emulator-fleet: apiVersion: 'prefixfleet.io/v1' is not served" in out
    assert models.API_VERSION in out
    assert ": ok" not in out


@pytest.mark.parametrize("kind", ["PrefixCacheFleets", "PrefixcacheFleet", "Fleet"])
def test_a_misspelt_kind_of_our_group_is_invalid_not_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    path = _write(tmp_path, kind=kind)
    assert main(["operator", "validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"kind: {kind!r} is not a kind of prefixfleet.io" in out
    assert "skipped" not in out


def test_another_groups_objects_are_still_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump_all([other, yaml.safe_load(EXAMPLE.read_text())]))
    assert main(["operator", "validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "skipped a ConfigMap" in out and "emulator-fleet: ok" in out


@pytest.mark.parametrize(
    "text", ["", "# only a comment\n", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"]
)
def test_input_with_no_fleet_at_all_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    assert main(["operator", "validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"prefixfleet operator validate: error: no {models.KIND} in {path}"


def test_broken_yaml_is_one_line_naming_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("apiVersion: prefixfleet.io/v1alpha1\nspec:\n  model: {name: m\n")
    assert main(["operator", "validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    assert err.startswith(f"prefixfleet operator validate: error: {path} is not valid YAML: line ")


def _list_file(tmp_path: Path, list_kind: str, *items: object) -> Path:
    path = tmp_path / "list.yaml"
    api_version = "v1" if list_kind == "List" else models.API_VERSION
    path.write_text(
        yaml.safe_dump({"apiVersion": api_version, "kind": list_kind, "metadata": {}, "items": list(items)})
    )
    return path


@pytest.mark.parametrize("list_kind", ["List", "PrefixCacheFleetList"])
def test_the_fleets_of_a_list_are_checked_as_kubectl_apply_reads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], list_kind: str
) -> None:
    # `kubectl get pcf -o yaml > fleets.yaml` writes a List, which `kubectl apply -f` takes item by
    # item; validate said "skipped a List" and "no PrefixCacheFleet" (exit 2), or refused the
    # PrefixCacheFleetList itself as a misspelt kind (exit 1)
    fleet = yaml.safe_load(EXAMPLE.read_text())
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    path = _list_file(tmp_path, list_kind, other, fleet)
    assert main(["operator", "validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "skipped a ConfigMap" in out and "emulator-fleet: ok" in out
    assert list_kind not in out

    broken = {**fleet, "spec": {**fleet["spec"], "replicas": "two"}}
    path = _list_file(tmp_path, list_kind, broken)
    assert main(["operator", "validate", str(path)]) == 1
    assert "emulator-fleet: spec.replicas" in capsys.readouterr().out
