"""The wheel adds one top-level name, `gpuflow`, and works outside the checkout.

setup.py maps the repository's hardware/, tasks/, flows/ and blocks/ folders into the
gpuflow namespace; a wheel that put `tasks` or `flows` into site-packages would collide
with any other project that has such a module. The wheel is built here, installed without
its dependencies into a fresh venv in a temporary folder (the dependencies come from this
checkout's venv through a path entry, so nothing is downloaded), and used from there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("hardware", "tasks", "flows", "blocks")

pytestmark = pytest.mark.slow


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kwargs)
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr}"
    return done


def tracked_files() -> list[str]:
    return list(filter(None, _run(["git", "ls-files", "-z"], cwd=ROOT).stdout.split("\0")))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    # Built from a copy of the tracked files, as a clean clone has them (and so that the
    # build leaves no build/ folder in the checkout).
    source = tmp_path_factory.mktemp("source")
    for name in tracked_files():
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    # No build isolation: the checkout's venv has setuptools, and CI needs no download.
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
        + ["--quiet", "--wheel-dir", str(dist), str(source)],
        cwd=dist,
    )
    (path,) = dist.glob("gpuflow-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory) -> Path:
    env_dir = tmp_path_factory.mktemp("venv") / "env"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    python = env_dir / "bin" / "python"
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
        ).stdout.strip()
    )
    before = set(os.listdir(site))
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
        + ["--no-deps", "--no-compile", str(wheel)]
    )
    added = set(os.listdir(site)) - before
    # The dependencies, from this checkout's venv: a plain path entry (its .pth files, the
    # editable gpuflow finder among them, are not run from there).
    (site / "zz_checkout_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env_dir.joinpath("added.txt").write_text("\n".join(sorted(added)))
    return env_dir


def test_wheel_holds_only_the_gpuflow_package(wheel: Path):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"gpuflow"}
    for layer in LAYERS:
        assert f"gpuflow/{layer}/__init__.py" in names
    # Every module of the layer folders is in the wheel, package data too.
    for name in tracked_files():
        if name.split("/")[0] in LAYERS and name.endswith((".py", ".yaml", ".proto")):
            assert f"gpuflow/{name}" in names, name
    assert "gpuflow/data/tour-plan.yaml" in names


def test_install_adds_only_gpuflow(venv: Path):
    added = set(venv.joinpath("added.txt").read_text().split())
    assert {n for n in added if not n.endswith(".dist-info")} == {"gpuflow"}
    assert [n for n in added if n.endswith(".dist-info")] == ["gpuflow-0.1.0.dist-info"]


def test_installed_wheel_runs_outside_the_checkout(venv: Path, tmp_path: Path):
    python = str(venv / "bin" / "python")
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "GPUFLOW_HOME": str(tmp_path / "home"),
        "GPUFLOW_BACKEND": "sim",
    }
    for name in ("tasks", "flows", "hardware", "blocks"):
        bare = subprocess.run(
            [python, "-c", f"import {name}"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert bare.returncode != 0 and "ModuleNotFoundError" in bare.stderr, name
    where = _run(
        [
            python,
            "-c",
            "import gpuflow.hardware, gpuflow.flows.train; print(gpuflow.hardware.__file__)",
        ],
        cwd=tmp_path,
        env=env,
    ).stdout.strip()
    assert where.startswith(str(venv)), where  # the installed copy, not the checkout
    listed = _run([str(venv / "bin" / "gpuflow"), "hw", "list"], cwd=tmp_path, env=env).stdout
    assert "a100" in listed.lower() and "dcu" in listed.lower(), listed
