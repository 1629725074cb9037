"""What a shard's serving image holds: the distributions it installs and the few gpuflow
source files it copies, nothing of the control plane (Prefect, MLflow, torch).

One list for both places that need it: the Dockerfile written beside every shard
(package.dockerfile_text) and scripts/check_coexistence.sh, which lays the same files out
beside MLServer, whose FastAPI pin Prefect cannot share (docs/edge.md). Standard library
only, so the script can run this file with any Python:

    python tasks/edge/shard_image.py distributions
    python tasks/edge/shard_image.py lay-out REPO_ROOT DEST
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

# What the shard server imports beyond the standard library (tasks/edge/serving).
SERVING_DISTRIBUTIONS = (
    "onnxruntime",
    "grpcio",
    "grpcio-health-checking",
    "protobuf",
    "prometheus_client",
    "numpy",
)

# (files in the gpuflow repository, where they go under the image's WORKDIR). A
# destination ending in "/" is a folder the sources are copied into, as Docker's COPY reads
# it; the repository keeps tasks/ at the top, the image under gpuflow/ as installed.
SERVING_SOURCES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("gpuflow/__init__.py",), "gpuflow/__init__.py"),
    (("tasks/__init__.py",), "gpuflow/tasks/__init__.py"),
    (("tasks/edge/__init__.py", "tasks/edge/manifest.py"), "gpuflow/tasks/edge/"),
    (("tasks/edge/serving",), "gpuflow/tasks/edge/serving"),
)


def lay_out(repo_root: Path, dest: Path) -> None:
    """Copy the serving sources into ``dest`` as the image's COPY lines do; ``python -m
    gpuflow.tasks.edge.serving.server`` then runs from ``dest``."""
    missing = [name for sources, _ in SERVING_SOURCES for name in sources]
    missing = [name for name in missing if not (repo_root / name).exists()]
    if missing:  # checked before the first copy, so a wrong root writes nothing
        raise FileNotFoundError(f"{repo_root} is not a gpuflow repository: no {missing[0]}")
    for sources, target in SERVING_SOURCES:
        for name in sources:
            path = repo_root / name
            to = dest / target / path.name if target.endswith("/") else dest / target
            to.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir():
                shutil.copytree(path, to, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(path, to)


def main(argv: list[str]) -> int:
    if argv[:1] == ["distributions"] and len(argv) == 1:
        print(" ".join(SERVING_DISTRIBUTIONS))
        return 0
    if argv[:1] == ["lay-out"] and len(argv) == 3:
        lay_out(Path(argv[1]), Path(argv[2]))
        return 0
    print("usage: shard_image.py distributions | lay-out REPO_ROOT DEST", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
