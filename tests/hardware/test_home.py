"""replace_atomically: the old file or the new one, never a part, and no temporary left."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpuflow.hardware import home
from gpuflow.hardware.home import replace_atomically


def test_a_new_file_replaces_the_old_and_its_folder_is_made(tmp_path: Path) -> None:
    path = tmp_path / "books" / "open.json"
    replace_atomically(path, b"old", ".book-")
    replace_atomically(path, b"new", ".book-")
    assert path.read_bytes() == b"new"
    assert [p.name for p in path.parent.iterdir()] == ["open.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "books" / "open.json"
    path.parent.mkdir()
    path.write_bytes(b"old")

    def refuse(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(home.os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        replace_atomically(path, b"new", ".book-")
    assert path.read_bytes() == b"old"
    assert [p.name for p in path.parent.iterdir()] == ["open.json"]
