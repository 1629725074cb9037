"""The shard image's recipe (package.dockerfile_text), run without Docker.

No Docker engine exists here, so the Dockerfile is carried out by hand, one instruction at
a time and strictly (an instruction this emulation does not know fails the test): its COPY
lines lay out the image's files, its pip line sets which distributions the server may
import (their requirement closure, nothing else of this venv), its ENTRYPOINT starts the
server from the image's WORKDIR and its HEALTHCHECK is asked until it says ready. What this
cannot check: the base image itself, and the unprivileged user (this interpreter lies
under /root, which another uid cannot enter).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from importlib import metadata
from pathlib import Path

import numpy as np
from gpuflow.tasks.edge.manifest import ShardManifest, TensorSpec, file_sha256, save_manifest
from gpuflow.tasks.edge.nodes import free_port
from gpuflow.tasks.edge.package import PROBE_PORT, SERVING_PORT, SERVING_UID, dockerfile_text
from gpuflow.tasks.edge.serving.client import OipClient
from gpuflow.tasks.edge.shard_image import lay_out
from onnx import TensorProto, helper, save
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO_ROOT = Path(__file__).resolve().parents[3]
KNOWN = {"FROM", "RUN", "WORKDIR", "COPY", "USER", "EXPOSE", "HEALTHCHECK", "ENTRYPOINT"}


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = text.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word, rest.strip()))
    return out


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _pip_pins(run: str) -> dict[str, str]:
    first = run.split("&&")[0].split()
    assert first[:2] == ["pip", "install"], run
    pins = {}
    for token in first[2:]:
        if token.startswith("-"):
            continue
        name, sep, version = token.partition("==")
        assert sep and version, f"the image installs {name!r} without a pinned version"
        pins[canonicalize_name(name)] = version
    return pins


def _closure(names: set[str]) -> set[str]:
    """The distributions pip installs for ``names``: their requirements, recursively, those
    whose markers hold here without extras."""
    todo, seen = list(names), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for spec in metadata.distribution(name).requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


def _site_of(dists: set[str], site: Path) -> None:
    """A site-packages holding only ``dists`` (links to this venv's files)."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    for name in dists:
        for file in metadata.distribution(name).files or []:
            parts = file.parts
            if parts[0] == ".." or len(parts) == 1 and parts[0].endswith(".pth"):
                continue
            top = purelib / parts[0]
            # A namespace folder (google/) is shared by several distributions: link below it.
            depth = 2 if top.is_dir() and not (top / "__init__.py").exists() else 1
            depth = min(depth, len(parts))
            link = site.joinpath(*parts[:depth])
            if not link.exists():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(purelib.joinpath(*parts[:depth]))


def _toy_shard(folder: Path) -> ShardManifest:
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "c"], ["y"])],
        "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4])],
        [helper.make_tensor("c", TensorProto.FLOAT, [1], [2.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    save(model, str(folder / "model.onnx"))
    manifest = ShardManifest(
        model_name="double-shard0",
        shard_index=0,
        num_shards=1,
        onnx_file="model.onnx",
        sha256=file_sha256(folder / "model.onnx"),
        inputs=[TensorSpec("x", (-1, 4), "FP32")],
        outputs=[TensorSpec("y", (-1, 4), "FP32")],
    )
    save_manifest(manifest, folder)
    return manifest


def _in_container(argv: list[str], image: Path, ports: dict[int, int]) -> list[str]:
    """The entry point as it runs in the container: absolute paths under the image's root,
    its ports as `docker run -p` would publish them, on loopback."""
    out = [str(image / word.lstrip("/")) if word.startswith("/") else word for word in argv]
    for i, word in enumerate(out[:-1]):
        if word == "--host":
            out[i + 1] = "127.0.0.1"
        elif word in ("--port", "--http-port"):
            out[i + 1] = str(ports[int(out[i + 1])])
    return out


def test_the_image_recipe_serves_a_shard_from_only_what_it_copies_and_installs(
    tmp_path: Path,
) -> None:
    context = tmp_path / "context"
    context.mkdir()
    manifest = _toy_shard(context)
    image, site = tmp_path / "image", tmp_path / "site-packages"
    workdir = image
    entrypoint: list[str] = []
    healthcheck: list[str] = []
    dists: set[str] = set()
    for word, args in _instructions(dockerfile_text(manifest)):
        assert word in KNOWN, f"this emulation does not know {word} (update the test)"
        if word == "FROM":
            # The server runs under this interpreter, whatever minor version the image has.
            assert args.startswith("python:3."), args
        elif word == "RUN":
            dists = _closure(set(_pip_pins(args)))
            assert f"--uid {SERVING_UID}" in args
        elif word == "WORKDIR":
            workdir = image / args.lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif word == "COPY":
            words = shlex.split(args)
            source = context
            if words[0] == "--from=gpuflow":  # the named build context: the repository
                source, words = REPO_ROOT, words[1:]
            *sources, dest = words
            target = image / dest.lstrip("/") if dest.startswith("/") else workdir / dest
            for name in sources:
                path = source / name
                to = target / path.name if dest.endswith("/") else target
                to.parent.mkdir(parents=True, exist_ok=True)
                if path.is_dir():
                    shutil.copytree(path, to, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy2(path, to)
        elif word == "USER":
            assert args == str(SERVING_UID)
        elif word == "HEALTHCHECK":
            healthcheck = json.loads(args.partition(" CMD ")[2])
        elif word == "ENTRYPOINT":
            entrypoint = json.loads(args)
    assert {"onnxruntime", "grpcio", "numpy"} <= dists
    # scripts/check_coexistence.sh lays the serving files out with shard_image.lay_out:
    # the same tree as the image's COPY lines.
    laid = tmp_path / "laid"
    lay_out(REPO_ROOT, laid)
    assert _files(laid) == _files(workdir) and _files(laid)
    _site_of(dists, site)
    ports = {SERVING_PORT: free_port("127.0.0.1", 0), PROBE_PORT: free_port("127.0.0.1", 0)}
    # -S: no site-packages of this venv (where gpuflow itself is installed), only the
    # image's; `python -m` from the WORKDIR finds gpuflow where the COPY lines put it.
    env = {"PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"}
    python = [sys.executable, "-S"]
    assert entrypoint[0] == "python" and healthcheck[0] == "python"
    argv = python + _in_container(entrypoint[1:], image, ports)
    probe = python + [
        w.replace(f":{PROBE_PORT}/", f":{ports[PROBE_PORT]}/") for w in healthcheck[1:]
    ]
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(argv, cwd=workdir, env=env, stdout=out, stderr=out)  # noqa: S603
    try:
        # As Docker does: ask the HEALTHCHECK until it passes (its start period is 30 s).
        deadline = time.monotonic() + 60.0
        while True:
            assert server.poll() is None, f"the server exited: {log.read_text()[-2000:]}"
            check = subprocess.run(probe, env=env, capture_output=True, timeout=10)  # noqa: S603
            if check.returncode == 0:
                break
            assert time.monotonic() < deadline, f"never healthy: {log.read_text()[-2000:]}"
            time.sleep(0.2)
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        with OipClient(f"127.0.0.1:{ports[SERVING_PORT]}", shared_memory="off") as client:
            assert client.infer(manifest.model_name, {"x": x})["y"].tolist() == (2 * x).tolist()
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert server.returncode == 0, log.read_text()[-2000:]


def test_the_emulation_refuses_a_server_that_imports_beyond_the_image(tmp_path: Path) -> None:
    """The site the server runs with holds the image's distributions and not this venv's
    others (pytest, prefect): otherwise the test above could not fail on a stray import."""
    site = tmp_path / "site-packages"
    _site_of(_closure({"numpy"}), site)
    env = {"PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    ok = subprocess.run(  # noqa: S603
        [sys.executable, "-S", "-c", "import numpy"], env=env, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    for module in ("pytest", "prefect", "gpuflow"):
        stray = subprocess.run(  # noqa: S603
            [sys.executable, "-S", "-c", f"import {module}"],
            env=env,
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert "ModuleNotFoundError" in stray.stderr, (module, stray.stderr)
