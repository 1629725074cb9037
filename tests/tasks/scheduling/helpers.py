"""Helpers for the scheduler tests: small in-memory fleets."""

from __future__ import annotations

from collections.abc import Sequence

from gpuflow.hardware.skus import SKUS
from gpuflow.tasks.scheduling.engine import Engine
from gpuflow.tasks.scheduling.model import SchedulerConfig

A100 = "NVIDIA A100-SXM4-40GB"
A100_80 = "NVIDIA A100-SXM4-80GB"
V100 = "Tesla V100-SXM2-32GB"
DCU = "Hygon DCU Z100"


def make_engine(
    nodes: list[tuple[str, str, str, int]],
    spares: Sequence[tuple[str, str, str, int]] = (),
    **config,
) -> Engine:
    """nodes, and spare-pool nodes: (name, region, SKU, devices). Device uuids read
    "<node>-<index>"."""
    engine = Engine(SchedulerConfig(**config))
    roles = [(n, True) for n in nodes] + [(n, False) for n in spares]
    for (name, region, sku, count), active in roles:
        engine.fleet.add_node(name, region, active=active)
        spec = SKUS[sku]
        kinds = ("mig",) if spec.supports_mig else ("vdcu",) if spec.supports_vdcu else ()
        for i in range(count):
            engine.fleet.add_device(
                name, i, f"{name}-{i}", sku, spec.vendor, spec.memory_total_mb, kinds
            )
    return engine
