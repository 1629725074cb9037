"""Prefect Blocks of gpuflow: `prefect block register -m blocks` registers them all."""

from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.blocks.edge_fleet import EdgeFleet
from gpuflow.blocks.gpu_cluster import GpuCluster

__all__ = ["CheckpointStorage", "EdgeFleet", "GpuCluster"]
