"""shard_image: the serving image's file list, laid out by hand (scripts/check_coexistence.sh).

That the list matches the Dockerfile is checked where the Dockerfile is carried out
(test_package.py); here, what the script calls."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from gpuflow.tasks.edge import shard_image

REPO_ROOT = Path(__file__).resolve().parents[3]
SCRIPT = REPO_ROOT / "tasks" / "edge" / "shard_image.py"


def test_the_script_lays_out_an_importable_server_with_nothing_of_the_control_plane(
    tmp_path: Path,
) -> None:
    dest = tmp_path / "image"
    run = subprocess.run(  # noqa: S603
        [sys.executable, "-S", str(SCRIPT), "lay-out", str(REPO_ROOT), str(dest)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert (dest / "gpuflow/tasks/edge/serving/server.py").is_file()
    assert (dest / "gpuflow/tasks/edge/manifest.py").is_file()
    assert not (dest / "gpuflow/tasks/edge/package.py").exists()
    assert not list(dest.rglob("__pycache__"))
    # The laid-out package is the one Python finds from there, not this venv's install.
    found = subprocess.run(  # noqa: S603
        [sys.executable, "-c", "import gpuflow.tasks.edge.manifest as m; print(m.__file__)"],
        cwd=dest,
        capture_output=True,
        text=True,
    )
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()).is_relative_to(dest)


def test_the_script_names_the_distributions_with_the_standard_library_only() -> None:
    run = subprocess.run(  # noqa: S603
        [sys.executable, "-S", "-I", str(SCRIPT), "distributions"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == list(shard_image.SERVING_DISTRIBUTIONS)


def test_a_folder_that_is_no_repository_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    # The first two sources are there, the third is not: nothing may be copied.
    partial = tmp_path / "partial"
    for name in ("gpuflow/__init__.py", "tasks/__init__.py"):
        (partial / name).parent.mkdir(parents=True, exist_ok=True)
        (partial / name).write_text("")
    dest = tmp_path / "image"
    with pytest.raises(FileNotFoundError, match="not a gpuflow repository: no tasks/edge/__init__"):
        shard_image.lay_out(partial, dest)
    assert not dest.exists()


def test_bad_words_get_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert shard_image.main(["lay-out", "only-one"]) == 2
    assert "usage: shard_image.py" in capsys.readouterr().err
