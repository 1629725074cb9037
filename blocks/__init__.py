"""Prefect Blocks of gpuflow: `prefect block register -m blocks` registers them all."""

from blocks.gpu_cluster import GpuCluster

__all__ = ["GpuCluster"]
