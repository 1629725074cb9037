"""Export: the devices' current layout as a plan document (mig-parted's ``export``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuflow.hardware.backend import Backend
from gpuflow.hardware.partition.layout import current_layout
from gpuflow.hardware.partition.select import select_devices
from gpuflow.hardware.partition.spec import PLAN_VERSION

EXPORT_CONFIG_NAME = "current"  # mig-parted export's default config label


def export_layout(
    backend: Backend, nodes: Sequence[str] | None = None, config_name: str = EXPORT_CONFIG_NAME
) -> dict[str, Any]:
    """The current layout as a plan document, one entry per device (config ``current``).

    Applying the export to the same fleet changes nothing.
    """
    entries: list[dict[str, Any]] = []
    for dev in select_devices(backend, nodes):
        have = current_layout(backend, dev)
        entry: dict[str, Any] = {
            "device-filter": dev.pci_device_id or dev.sku,
            "devices": [dev.index],
            "nodes": [dev.node],
            "mig-enabled": have.mig_enabled,
            "mig-devices": have.mig_counts() if have.mig_enabled else {},
        }
        vdcus = have.vdcu_sizes()
        if vdcus:
            entry["vdcu-devices"] = [{"compute-units": c, "memory-mb": m} for c, m in vdcus]
        entries.append(entry)
    return {"version": PLAN_VERSION, "mig-configs": {config_name: entries}}
