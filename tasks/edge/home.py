"""Where an edge deployment name keeps its state, and the error every edge step raises.

GPUFLOW_HOME/edge/<name>/          current (the serving version), target (its head's
                                   address, for the stable endpoint), endpoint.json
GPUFLOW_HOME/edge/<name>/<version>/ deployment.json, model/, shards/, logs/
"""

from __future__ import annotations

import re
from pathlib import Path

from gpuflow.hardware.home import gpuflow_home

_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
REPO_ROOT = Path(__file__).resolve().parents[2]  # child processes find the tasks package here
TARGET_FILE = "target"  # the current head's address, for the stable endpoint


class EdgeDeployError(RuntimeError):
    """A deployment could not be started, checked or found."""


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise EdgeDeployError(f"deployment name must match [A-Za-z0-9_.-]+, got {name!r}")
    return name


def edge_root() -> Path:
    return gpuflow_home() / "edge"


def name_dir(name: str) -> Path:
    return edge_root() / check_name(name)


def version_dir(name: str, version: str) -> Path:
    return name_dir(name) / version


def target_file(name: str) -> Path:
    return name_dir(name) / TARGET_FILE
