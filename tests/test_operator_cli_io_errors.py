"""`prefixfleet operator crd --output` and `operator validate` on files they cannot write or read.

``crd --output`` naming a directory (or a full disk, a device) and ``validate`` of a file that is not
UTF-8 text (a manifest saved as UTF-16 by an editor, a binary given by mistake) ended with a
traceback; each is now one error line naming the file, exit 2.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from prefixfleet.cli import main


def test_crd_output_naming_a_directory_is_an_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["operator", "crd", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"error: --output: cannot write {tmp_path}: Is a directory" in err and "Traceback" not in err


def test_crd_output_to_a_full_disk_is_an_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    assert main(["operator", "crd", "--output", "/dev/full"]) == 2
    assert "error: --output: cannot write /dev/full: No space left on device" in capsys.readouterr().err


def test_validate_of_a_file_that_is_not_utf8_is_an_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("kind: PrefixCacheFleet\n", encoding="utf-16")  # with a BOM: 0xff 0xfe
    assert main(["operator", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"error: {path} is not UTF-8 text: byte 0: invalid start byte" in err


def test_validate_of_stdin_that_is_not_utf8_is_an_error_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"kind: \xff\n"), encoding="utf-8"))
    assert main(["operator", "validate", "-"]) == 2
    assert "error: - is not UTF-8 text: byte 6: invalid start byte" in capsys.readouterr().err
