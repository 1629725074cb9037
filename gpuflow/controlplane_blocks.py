"""Save gpuflow's default Blocks on the Prefect server in PREFECT_API_URL (run by `gpuflow up`)."""

from __future__ import annotations

import os

from gpuflow.blocks import CheckpointStorage, GpuCluster


def save_default_blocks() -> list[str]:
    """`gpuflow-default` GpuCluster and `gpuflow-local` CheckpointStorage; kept if they exist."""
    saved = []
    backend = os.environ.get("GPUFLOW_BACKEND", "auto") or "auto"
    for name, block in (
        ("gpuflow-default", GpuCluster(backend=backend)),
        ("gpuflow-local", CheckpointStorage()),
    ):
        try:
            type(block).load(name)
        except ValueError:
            block.save(name)
            saved.append(name)
    return saved


if __name__ == "__main__":
    print("saved:", ", ".join(save_default_blocks()) or "nothing new")
