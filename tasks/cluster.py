"""Which cluster a flow works on: a saved GpuCluster block by name, or the default one."""

from __future__ import annotations

from gpuflow.blocks.gpu_cluster import GpuCluster


def load_cluster(block_name: str | None = None) -> GpuCluster:
    """The named GpuCluster block (saved in Prefect), or GpuCluster() from the environment."""
    if not block_name:
        return GpuCluster()
    return GpuCluster.load(block_name)
