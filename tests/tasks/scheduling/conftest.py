"""A twin-backed cluster for the scheduler's service and integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest

CLUSTER_YAML = """
name: sched-test
seed: 11
faults: {natural: false}
nodes:
  - name: a100-0
    region: cn-north
    role: active
    devices: [{sku: a100-40gb, count: 2}]
  - name: a100-1
    region: cn-north
    role: active
    devices: [{sku: a100-40gb, count: 2}]
  - name: v100-0
    region: cn-east
    role: active
    devices: [{sku: v100, count: 2}]
  - name: dcu-0
    region: cn-east
    role: active
    devices: [{sku: dcu-z100, count: 1}]
"""


@pytest.fixture
def cluster(tmp_path: Path, inventory_url: str):
    """A GpuCluster on a small twin (no natural faults), with its inventory synced; the
    inventory on SQLite and on PostgreSQL (``inventory_url``)."""
    from gpuflow.blocks.gpu_cluster import GpuCluster
    from pydantic import SecretStr

    spec = tmp_path / "cluster.yaml"
    spec.write_text(CLUSTER_YAML)
    c = GpuCluster(backend="sim", cluster_spec=str(spec), inventory_url=SecretStr(inventory_url))
    c.get_inventory().sync(c.get_backend())
    return c
