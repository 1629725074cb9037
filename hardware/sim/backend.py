"""SimBackend: the digital twin of a mixed fleet behind the ordinary Backend interface.

Every call is one transaction on the shared state (see hardware.sim.core), so separate
processes - a flow, a monitor, the CLI - see one fleet, and a request that is rejected
changes nothing. SimBackend is composed of one facet per kind of call: partitions_api
(MIG / vDCU), clocks_api (clocks and power limits), tenants_api and faults_api; this
module adds discovery, telemetry and the twin's clock. Beyond the Backend methods the twin
offers what a real fleet does to you: tenants and their fate (``set_workload``,
``tenant_fatal_error``), faults (``inject_fault``, natural ones from the hazard model,
``repair``), a fast-forward clock (``advance``) and the labels a health model learns from
(``fault_log``).
"""

from __future__ import annotations

from typing import Any

from gpuflow.hardware.backend import DeviceInfo, NodeInfo, TelemetrySample
from gpuflow.hardware.sim import clock as simclock
from gpuflow.hardware.sim import faults as F
from gpuflow.hardware.sim import fleet, workloads
from gpuflow.hardware.sim.clocks_api import ClocksApi
from gpuflow.hardware.sim.cluster_spec import ClusterSpec
from gpuflow.hardware.sim.faults_api import FaultsApi
from gpuflow.hardware.sim.maintenance_api import MaintenanceApi
from gpuflow.hardware.sim.partitions_api import PartitionsApi
from gpuflow.hardware.sim.tenants_api import TenantsApi
from gpuflow.hardware.skus import SkuSpec
from gpuflow.hardware.telemetry_fields import real_backend_fields, without_unreadable

FIRST_READ_XID_WINDOW_S = 300.0  # a new reader sees XIDs from the last 5 sim-minutes


class SimBackend(PartitionsApi, ClocksApi, TenantsApi, FaultsApi, MaintenanceApi):
    """The twin. ``home`` defaults to GPUFLOW_HOME; state lives in ``home/twin``.

    ``spec_path`` (a cluster spec YAML) is used when the twin is created; if a twin
    already exists from a different spec, construction fails and says how to reset.
    """

    name = "sim"

    def spec(self) -> ClusterSpec:
        """The cluster spec the twin was created from."""
        with self._txn() as (state, _):
            return ClusterSpec.from_dict(state["spec"], source=state["spec_source"])

    # -- discovery ---------------------------------------------------------------------

    @staticmethod
    def _device_info(dev: dict[str, Any]) -> DeviceInfo:
        s = fleet.sku_of(dev)
        kinds: tuple[Any, ...] = (
            ("mig",) if s.supports_mig else ("vdcu",) if s.supports_vdcu else ()
        )
        return DeviceInfo(
            node=dev["node"],
            index=dev["index"],
            vendor=s.vendor,
            sku=s.name,
            uuid=dev["uuid"],
            memory_total_mb=s.memory_total_mb,
            pci_device_id=s.pci_device_id,
            partition_kinds=kinds,
        )

    def discover(self) -> list[NodeInfo]:
        with self._txn() as (state, _):
            return [
                NodeInfo(
                    name=n["name"],
                    region=n["region"],
                    role=n["role"],
                    devices=tuple(
                        self._device_info(d)
                        for d in state["devices"].values()
                        if d["node"] == n["name"]
                    ),
                )
                for n in state["nodes"]
            ]

    # -- telemetry ---------------------------------------------------------------------

    @staticmethod
    def _fields_of(s: SkuSpec) -> frozenset[str]:
        # What the SKU's real backend reads (NVML by architecture, hy-smi for DCUs): a
        # model trained on the twin must not lean on signals its fleet cannot report.
        return real_backend_fields(s.vendor, F.uses_row_remapping(s))

    def telemetry_fields(self, node: str, index: int) -> frozenset[str]:
        """The optional fields the real backend of this device's SKU reads."""
        with self._txn() as (state, _):
            return self._fields_of(fleet.sku_of(self._dev(state, node, index)))

    def telemetry(self, node: str, index: int) -> TelemetrySample:
        with self._txn() as (state, now):
            dev = self._dev(state, node, index)
            s = fleet.sku_of(dev)
            key = (state["generation"], dev["node"], dev["index"])
            last = self._xid_cursor.get(key)
            if last is None:
                xids = [x for seq, t, x in dev["xids"] if t >= now - FIRST_READ_XID_WINDOW_S]
            else:
                xids = [x for seq, t, x in dev["xids"] if seq > last]
            if dev["xids"]:
                self._xid_cursor[key] = dev["xids"][-1][0]
            elif last is None:
                self._xid_cursor[key] = 0
            c = F.counters_at(dev, now)
            present = dev["health"] != "lost"
            op = fleet.operating(state, dev)
            if present:
                util = workloads.device_load(state, dev, s.compute_units)
                mem = workloads.memory_used_mb(state, dev)
            else:
                util, mem = 0.0, 0
            values: dict[str, Any] = {
                "ecc_corrected_total": c["ecc_corrected"],
                "ecc_uncorrected_total": c["ecc_uncorrected"],
                "retired_pages": c["retired_pages"],
                "remapped_rows_correctable": c["remap_correctable"],
                "remapped_rows_uncorrectable": c["remap_uncorrectable"],
                "remapped_rows_pending": c["remap_pending"],
                "remapped_rows_failure": c["remap_failure"],
                "clock_event_reasons": op.reasons,
                "xids": tuple(xids),
            }
            readable = self._fields_of(s)
            if not present:
                # A device off the bus answers nothing: only the XIDs it left are known.
                readable = readable & {"xids"}
            # A fault that shows only through a field this SKU's backend cannot read does
            # not show at all there: the device still fails, without warning, as it would.
            return TelemetrySample(
                node=dev["node"],
                index=dev["index"],
                timestamp_s=now,
                present=present,
                temperature_c=round(dev["temperature_c"], 2) if present else 0.0,
                power_mw=int(round(op.power_mw)),
                energy_mj=int(dev["energy_mj"]),
                utilization_ratio=round(util, 4),
                memory_used_mb=mem,
                memory_total_mb=s.memory_total_mb,
                sm_clock_mhz=op.clock_mhz,
                power_limit_mw=dev["power_limit_mw"],
                **without_unreadable(values, readable),
            )

    # -- the twin's clock --------------------------------------------------------------

    def now_s(self) -> float:
        """Sim time (Unix-like seconds; runs ahead of the wall clock after ``advance``)."""
        with self._txn() as (_, now):
            return now

    def advance(self, seconds: float) -> float:
        """Fast-forward every process's view of the fleet; returns the new sim time."""
        with self._store.transaction(self._create) as state:
            self._check_version(state)
            fleet.sync_all(state, simclock.now_s(state["clock"]))
            now = simclock.advance(state["clock"], seconds)
            fleet.sync_all(state, now)
            return now
