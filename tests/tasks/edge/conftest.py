"""Edge fixtures: one exported small ResNet per session, and a guard that no shard server
started by a test outlives it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuflow.tasks.edge.deploy import SERVER_MODULE


def running_servers(marker: str) -> list[int]:
    """Pids of shard server processes whose command line mentions ``marker`` (a folder)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if SERVER_MODULE in args and marker in args and state != "Z":
            pids.append(int(proc.name))
    return pids


@pytest.fixture(autouse=True)
def no_leftover_servers(gpuflow_home: Path) -> Iterator[None]:
    """Fail a test that leaves a shard server running, and stop the leftovers."""
    yield
    import os
    import signal

    left = running_servers(str(gpuflow_home))
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"test left shard servers running: {left}"


@pytest.fixture(scope="session")
def exported_digits(tmp_path_factory: pytest.TempPathFactory):
    """resnet18-digits (ResNet-18 layout, width 32, 1x8x8 input) exported once."""
    from gpuflow.tasks.edge.export import export_model

    return export_model("resnet18-digits", tmp_path_factory.mktemp("export"), seed=0)


@pytest.fixture(scope="session")
def digits_profile(exported_digits):
    from gpuflow.tasks.edge.profile import profile_nodes

    return profile_nodes(
        exported_digits.onnx_path, exported_digits.sample_inputs(), runs=5, warmup=2
    )
