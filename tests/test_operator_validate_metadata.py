"""`prefixfleet operator validate` on a fleet whose ``metadata`` is not a mapping.

A hand-written manifest with ``metadata: my-fleet`` (the name where the mapping belongs) or a list
there crashed the command with a traceback (``'str' object has no attribute 'get'``) while it built
the line's label; now it is one line naming the field, and exit status 1, as for any invalid fleet.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixfleet.cli import main

FLEET = """apiVersion: prefixfleet.io/v1alpha1
kind: PrefixCacheFleet
metadata: {metadata}
spec:
  model: {{name: m}}
  engine: {{kind: emulator}}
"""


@pytest.mark.parametrize(("metadata", "shown"), [("my-fleet", "'my-fleet'"), ("[a, b]", "['a', 'b']")])
def test_metadata_that_is_not_a_mapping_is_said_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], metadata: str, shown: str
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET.format(metadata=metadata))
    assert main(["operator", "validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.strip() == f"{path}: <unnamed>: metadata: {shown} is not of type 'object'"
