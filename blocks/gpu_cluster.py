"""GpuCluster: which backend drives the fleet, its twin spec, and where the inventory lives."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from gpuflow.hardware.backend import Backend
from prefect.blocks.core import Block
from pydantic import Field, SecretStr, field_validator


class GpuCluster(Block):
    """A GPU fleet as gpuflow's flows see it.

    ``backend`` auto picks NVML, then hy-smi, then the digital twin. ``cluster_spec`` is
    the twin's fleet (a YAML path; empty = the embedded mixed fleet). ``inventory_url``
    is a SQLAlchemy URL (empty = SQLite under GPUFLOW_HOME); it is a secret because a
    PostgreSQL URL carries a password.
    """

    _block_type_name = "gpuflow GPU Cluster"
    _block_type_slug = "gpuflow-gpu-cluster"
    _description = "A GPU fleet (NVML, Hygon hy-smi or the digital twin) and its inventory."

    backend: Literal["auto", "nvml", "hygon", "sim"] = Field(
        default="auto", description="Device backend: auto, nvml, hygon or sim (the digital twin)."
    )
    cluster_spec: str = Field(
        default="", description="Twin fleet spec (YAML path); empty for the embedded default."
    )
    inventory_url: SecretStr | None = Field(
        default=None,
        description="SQLAlchemy URL of the inventory; empty for SQLite in GPUFLOW_HOME.",
    )

    @field_validator("cluster_spec")
    @classmethod
    def _spec_exists(cls, value: str) -> str:
        if value and not Path(value).expanduser().is_file():
            raise ValueError(f"cluster_spec {value!r} is not a file")
        return value

    def get_backend(self) -> Backend:
        from gpuflow.hardware.select import get_backend

        spec = Path(self.cluster_spec).expanduser() if self.cluster_spec else None
        return get_backend(self.backend, spec_path=spec)

    def get_inventory(self):  # -> hardware.inventory.Inventory (imported lazily)
        from gpuflow.hardware.inventory import Inventory

        return Inventory(self.inventory_url.get_secret_value() if self.inventory_url else None)
