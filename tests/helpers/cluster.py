"""What the job and remediation functions ask of a GpuCluster block: one inventory (on the
test's clock, if it has one) and one backend (the twin)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuflow.hardware.backend import Backend
from gpuflow.hardware.inventory import Inventory


@dataclass
class Cluster:
    inventory: Inventory
    backend: Backend

    def get_inventory(self) -> Inventory:
        return self.inventory

    def get_backend(self) -> Backend:
        return self.backend
