"""Export: the devices' current layout as a plan document (mig-parted's ``export``).

Plain mig-parted v1 by default: one node's devices (mig-parted runs per node), keys
mig-parted knows and nothing else, so its own loader (which rejects unknown fields) reads
it. ``with_nodes`` writes gpuflow's extended form instead: every selected node in one
document, each entry with its ``nodes``, DCUs with their ``vdcu-devices``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuflow.hardware.backend import Backend, DeviceLostError, InvalidRequestError
from gpuflow.hardware.partition.layout import current_layout
from gpuflow.hardware.partition.select import select_devices
from gpuflow.hardware.partition.spec import PLAN_VERSION

EXPORT_CONFIG_NAME = "current"  # mig-parted export's default config label


def export_layout(
    backend: Backend,
    nodes: Sequence[str] | None = None,
    config_name: str = EXPORT_CONFIG_NAME,
    with_nodes: bool = False,
) -> dict[str, Any]:
    """The current layout as a plan document, one entry per device (config ``current``).

    Applying the export to the same fleet changes nothing. Plain (``with_nodes`` False):
    the selection must be one node, and a device with vDCUs (which v1 cannot say) is
    refused, naming it; nothing is written in either case.
    """
    devices = list(select_devices(backend, nodes))
    on = sorted({dev.node for dev in devices})
    if not with_nodes and len(on) > 1:
        raise InvalidRequestError(
            f"a plain mig-parted export is one node's; the selection has {len(on)} "
            f"({', '.join(on)}): pick one with --node, or export --with-nodes (gpuflow's "
            "extended form, one document for all)"
        )
    entries: list[dict[str, Any]] = []
    for dev in devices:
        try:
            have = current_layout(backend, dev)
        except DeviceLostError:
            continue  # as NVML leaves a lost GPU out: nothing to export for it
        entry: dict[str, Any] = {
            "device-filter": dev.pci_device_id or dev.sku,
            "devices": [dev.index],
        }
        if with_nodes:
            entry["nodes"] = [dev.node]
        entry["mig-enabled"] = have.mig_enabled
        entry["mig-devices"] = have.mig_counts() if have.mig_enabled else {}
        vdcus = have.vdcu_sizes()
        if vdcus and not with_nodes:
            raise InvalidRequestError(
                f"{dev.node}:{dev.index} has {len(vdcus)} vDCU(s), which mig-parted's v1 "
                "cannot say: export --with-nodes (gpuflow's extended form)"
            )
        if vdcus:
            entry["vdcu-devices"] = [{"compute-units": c, "memory-mb": m} for c, m in vdcus]
        entries.append(entry)
    return {"version": PLAN_VERSION, "mig-configs": {config_name: entries}}
