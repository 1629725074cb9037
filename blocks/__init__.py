"""Prefect Blocks of gpuflow: `prefect block register -m blocks` registers them all."""

from blocks.checkpoint_storage import CheckpointStorage
from blocks.edge_fleet import EdgeFleet
from blocks.gpu_cluster import GpuCluster

__all__ = ["CheckpointStorage", "EdgeFleet", "GpuCluster"]
