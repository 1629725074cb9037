"""One refresh of the telemetry exporter: every device and partition of its scope sampled
once, scored by the health model, joined with the inventory's cordons and leases, and
turned into metric families.

The families are plain data (tasks.telemetry.collector hands them to prometheus_client),
so a scrape only reads the last snapshot and never touches the hardware. The builder is
long-lived on purpose: it keeps one backend (one NVML session with its XID event sets, one
twin instance with its XID cursor), so the XIDs between two refreshes are folded into
per-XID counters instead of being missed, and one FleetScorer, whose windows grow from
refresh to refresh as the monitor's do.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuflow.hardware.backend import (
    Backend,
    DeviceInfo,
    HardwareError,
    InvalidRequestError,
    NodeInfo,
    TelemetrySample,
)
from gpuflow.hardware.dcgm_mapping import (
    CLOCK_SPECS,
    FB_TOTAL,
    XID_COUNT,
    XID_LAST,
    MetricKind,
    MetricSpec,
    clock_values,
    device_labels,
    instance_ids,
    partition_labels,
    sample_specs,
    sample_values,
)
from gpuflow.hardware.nvml.telemetry import CLOCK_EVENT_BITS
from gpuflow.tasks.health.events import DeviceRisk
from gpuflow.tasks.health.sampler import DEFAULT_INTERVAL_S, FleetSample, TelemetrySampler
from gpuflow.tasks.health.scoring import FleetScorer, max_clocks

log = logging.getLogger(__name__)

Labels = dict[str, str]
Key = tuple[str, int]


@dataclass(frozen=True)
class FamilySpec:
    name: str
    kind: MetricKind
    help: str


# gpuflow's own series: what DCGM has no name for.
DEVICE_INFO = FamilySpec(
    "gpuflow_device_info",
    "gauge",
    "1 for every device the exporter sees: vendor, SKU (modelName), node, region, role.",
)
DEVICE_PRESENT = FamilySpec(
    "gpuflow_device_present", "gauge", "1 while the device answers, 0 once it fell off the bus."
)
CLOCK_EVENT = FamilySpec(
    "gpuflow_clock_event_reason",
    "gauge",
    "1 while this clock event (throttle) reason holds, else 0 (NVML's reason names).",
)

if TYPE_CHECKING:
    # A type only: importing the module would load torch and sklearn (seconds).
    from gpuflow.tasks.health.model import HealthModel
PARTITION_INFO = FamilySpec(
    "gpuflow_partition_info",
    "gauge",
    "1 for every partition (MIG instance, vDCU), with its UUID and kind.",
)
HEALTH_RISK = FamilySpec(
    "gpuflow_health_risk",
    "gauge",
    "Risk of failure within the model's horizon, 0..1 (1: lost or failed), and the model.",
)
CORDONED = FamilySpec(
    "gpuflow_device_cordoned", "gauge", "1 while the device or its node is cordoned, else 0."
)
CORDON_INFO = FamilySpec(
    "gpuflow_cordon_info", "gauge", "1 for each cordon on the device: its scope and reason."
)
LEASE_INFO = FamilySpec(
    "gpuflow_lease_info",
    "gauge",
    "1 for each unexpired lease on the device or one of its partitions: its owner.",
)
READ_ERRORS = FamilySpec(
    "gpuflow_telemetry_read_errors",
    "counter",
    "Telemetry reads of the device that failed (not a lost device) since the start.",
)
GPUFLOW_FAMILIES: tuple[FamilySpec, ...] = (
    DEVICE_INFO,
    DEVICE_PRESENT,
    CLOCK_EVENT,
    PARTITION_INFO,
    HEALTH_RISK,
    CORDONED,
    CORDON_INFO,
    LEASE_INFO,
    READ_ERRORS,
)

# The exporter's own health (tasks.telemetry.exporter adds them at scrape time).
EXPORTER_INFO = FamilySpec(
    "gpuflow_exporter_info", "gauge", "1: which backend, nodes and health model this serves."
)
EXPORTER_INTERVAL = FamilySpec(
    "gpuflow_exporter_interval_seconds", "gauge", "Seconds between two reads of the devices."
)
EXPORTER_REFRESHES = FamilySpec(
    "gpuflow_exporter_refreshes", "counter", "Snapshots taken since the exporter started."
)
EXPORTER_FAILURES = FamilySpec(
    "gpuflow_exporter_refresh_failures",
    "counter",
    "Refreshes that failed (the previous snapshot was kept).",
)
EXPORTER_STAGE_ERRORS = FamilySpec(
    "gpuflow_exporter_stage_errors",
    "counter",
    "Parts of refreshes left out, by stage (clocks, partitions, health, inventory).",
)
EXPORTER_LAST_REFRESH = FamilySpec(
    "gpuflow_exporter_last_refresh_timestamp_seconds",
    "gauge",
    "When the served snapshot was taken (Unix time).",
)
EXPORTER_DURATION = FamilySpec(
    "gpuflow_exporter_refresh_duration_seconds", "gauge", "How long the served snapshot took."
)
EXPORTER_FAMILIES: tuple[FamilySpec, ...] = (
    EXPORTER_INFO,
    EXPORTER_INTERVAL,
    EXPORTER_REFRESHES,
    EXPORTER_FAILURES,
    EXPORTER_STAGE_ERRORS,
    EXPORTER_LAST_REFRESH,
    EXPORTER_DURATION,
)


def catalogue(ecc_counter: str = "volatile") -> tuple[MetricSpec | FamilySpec, ...]:
    """Every family the exporter can serve (docs/telemetry.md lists each one)."""
    return (
        sample_specs(ecc_counter)
        + CLOCK_SPECS
        + (XID_LAST, XID_COUNT)
        + GPUFLOW_FAMILIES
        + EXPORTER_FAMILIES
    )


def sample_name(spec: MetricSpec | FamilySpec) -> str:
    """The name its samples have in the exposition: a counter's end in _total."""
    return spec.name + "_total" if spec.kind == "counter" else spec.name


@dataclass(frozen=True)
class Family:
    """One metric family of a snapshot: samples as (labels, value)."""

    name: str
    kind: MetricKind
    help: str
    samples: tuple[tuple[Labels, float], ...]


def family(spec: MetricSpec | FamilySpec, samples: Iterable[tuple[Labels, float]]) -> Family:
    return Family(spec.name, spec.kind, spec.help, tuple(samples))


@dataclass(frozen=True)
class Snapshot:
    taken_at_s: float  # wall clock when the refresh started
    duration_s: float
    devices: int
    partitions: int
    families: tuple[Family, ...]

    def family(self, name: str) -> Family | None:
        return next((f for f in self.families if f.name == name), None)


class _Families:
    """Collects samples per family, in first-seen order."""

    def __init__(self) -> None:
        self._specs: dict[str, MetricSpec | FamilySpec] = {}
        self._samples: dict[str, list[tuple[Labels, float]]] = {}

    def add(self, spec: MetricSpec | FamilySpec, labels: Labels, value: float) -> None:
        self._specs.setdefault(spec.name, spec)
        self._samples.setdefault(spec.name, []).append((labels, float(value)))

    def freeze(self) -> tuple[Family, ...]:
        return tuple(
            Family(name, spec.kind, spec.help, tuple(self._samples[name]))
            for name, spec in self._specs.items()
        )


def check_scope(backend: Backend, nodes: Iterable[str] | None) -> frozenset[str] | None:
    """The nodes to export (None: every node the backend sees); an unknown one is refused
    naming it and the known ones, before anything starts."""
    if nodes is None:
        return None
    wanted = frozenset(nodes)
    if not wanted:
        return None
    known = {n.name for n in backend.discover()}
    unknown = sorted(wanted - known)
    if unknown:
        raise InvalidRequestError(
            f"--node {', '.join(unknown)}: not a node of backend {backend.name!r} "
            f"(its nodes: {', '.join(sorted(known)) or 'none'})"
        )
    return wanted


@dataclass
class _Xids:
    """What the exporter has seen of one device's XIDs since it started."""

    counts: Counter[int] = field(default_factory=Counter)
    last: int = 0


class SnapshotBuilder:
    """Takes snapshots of one backend's devices (those of ``nodes``, or all) with one
    long-lived backend session. ``model`` None leaves gpuflow_health_risk out;
    ``inventory`` None leaves out cordons and leases."""

    def __init__(
        self,
        backend: Backend,
        *,
        nodes: Iterable[str] | None = None,
        model: HealthModel | None = None,
        model_source: str = "",
        inventory: Any | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self.backend = backend
        self.nodes = check_scope(backend, nodes)
        self.sampler = TelemetrySampler(backend, interval_s)
        # No explanations: the exporter publishes the risk, the monitor explains it.
        self.scorer = FleetScorer(model, explain_above=math.inf) if model is not None else None
        self.model_source = model_source
        self.inventory = inventory
        self.ecc_counter = str(getattr(backend, "ecc_counter", "volatile"))
        self._xids: dict[Key, _Xids] = {}
        self._read_errors: Counter[Key] = Counter()
        self.stage_errors: Counter[str] = Counter()  # per stage: partitions, health, ...

    def _scope(self) -> list[NodeInfo]:
        return [n for n in self.backend.discover() if self.nodes is None or n.name in self.nodes]

    def take(self) -> Snapshot:
        """Sample, score and join once. A failed discovery raises (the exporter keeps the
        previous snapshot); a failed part (one device's partitions, the inventory, the
        model) leaves that part out of this snapshot and is counted."""
        started, t0 = time.time(), time.monotonic()
        nodes = self._scope()
        devices = [d for n in nodes for d in n.devices]
        fleet = self.sampler.sample_devices(devices)
        for d, _why in fleet.unreadable:
            self._read_errors[(d.node, d.index)] += 1
        samples: dict[Key, TelemetrySample] = {(s.node, s.index): s for s in fleet.samples}
        lost = {(x.device.node, x.device.index): x.sample for x in fleet.lost}
        risks = self._risks(fleet)
        cordons, leases = self._inventory()
        out = _Families()
        partitions = 0
        for node in nodes:
            for dev in node.devices:
                key = (dev.node, dev.index)
                labels = device_labels(dev)
                self._identity(out, node, dev, labels)
                sample = samples.get(key)
                if key in samples or key in lost:
                    out.add(DEVICE_PRESENT, labels, 1.0 if sample is not None else 0.0)
                if sample is not None:
                    self._readings(out, dev, labels, sample)
                self._xid_series(out, key, labels, sample or lost.get(key))
                plabels = self._partitions(out, dev) if sample is not None else {}
                partitions += len(plabels)
                risk = risks.get(key)
                if risk is not None:
                    reason = {"reason": risk.reason, "model": self.model_source}
                    out.add(HEALTH_RISK, {**labels, **reason}, risk.risk)
                if cordons is not None:
                    self._cordons(out, dev, labels, cordons)
                if leases is not None:
                    self._leases(out, dev, labels, plabels, leases)
                if self._read_errors[key]:
                    out.add(READ_ERRORS, labels, self._read_errors[key])
        return Snapshot(
            taken_at_s=started,
            duration_s=time.monotonic() - t0,
            devices=len(devices),
            partitions=partitions,
            families=out.freeze(),
        )

    # -- parts of a snapshot -------------------------------------------------------------

    def _identity(self, out: _Families, node: NodeInfo, dev: DeviceInfo, labels: Labels) -> None:
        extra = {
            "region": node.region,
            "role": node.role,
            "backend": self.backend.name,
            "pci_device_id": dev.pci_device_id or "",
        }
        out.add(DEVICE_INFO, {**labels, **extra}, 1.0)

    def _readings(
        self, out: _Families, dev: DeviceInfo, labels: Labels, sample: TelemetrySample
    ) -> None:
        for spec, value in sample_values(sample, self.ecc_counter):
            out.add(spec, labels, value)
        if sample.clock_event_reasons is not None:
            active = set(sample.clock_event_reasons)
            for reason in CLOCK_EVENT_BITS:
                out.add(CLOCK_EVENT, {**labels, "reason": reason}, float(reason in active))
        try:
            clocks = self.backend.clocks(dev.node, dev.index)
        except HardwareError as exc:
            self._stage_failed("clocks", dev, exc)
            return
        for spec, value in clock_values(clocks):
            out.add(spec, labels, value)

    def _xid_series(
        self, out: _Families, key: Key, labels: Labels, sample: TelemetrySample | None
    ) -> None:
        """DCGM's last-XID gauge and gpuflow's per-XID counters, for a device whose backend
        reads XIDs: every XID of every sample is counted, whenever the scrape comes."""
        seen = self._xids.get(key)
        if sample is not None and sample.xids is not None:
            seen = self._xids.setdefault(key, _Xids())
            for xid in sample.xids:
                seen.counts[xid] += 1
                seen.last = xid
        if seen is None:
            return  # its backend cannot read XIDs (None): absent, not zero
        out.add(XID_LAST, labels, seen.last)
        for xid, count in sorted(seen.counts.items()):
            out.add(XID_COUNT, {**labels, "xid": str(xid)}, count)

    def _partitions(self, out: _Families, dev: DeviceInfo) -> dict[str, Labels]:
        """Each partition's series; returns its labels by partition UUID (for leases)."""
        try:
            parts = self.backend.partitions(dev.node, dev.index)
            ids = instance_ids(self.backend, dev, parts)
        except HardwareError as exc:
            self._stage_failed("partitions", dev, exc)
            return {}
        found: dict[str, Labels] = {}
        for p in parts:
            plabels = partition_labels(dev, p, ids[p.uuid])
            found[p.uuid] = plabels
            out.add(PARTITION_INFO, {**plabels, "partition_uuid": p.uuid, "kind": p.kind}, 1.0)
            out.add(FB_TOTAL, plabels, p.memory_mb)
        return found

    def _risks(self, fleet: FleetSample) -> dict[Key, DeviceRisk]:
        if self.scorer is None:
            return {}
        try:
            risks = self.scorer.score_round(fleet, max_clocks(self.sampler, fleet))
        except (ValueError, RuntimeError) as exc:  # a model that cannot score this round
            self.stage_errors["health"] += 1
            log.warning("telemetry exporter: scoring failed: %s", exc)
            return {}
        return {(r.node, r.index): r for r in risks}

    def _inventory(self) -> tuple[list[Any] | None, list[Any] | None]:
        """(cordons, leases) from the inventory, or (None, None) without one or when it
        cannot be read: the devices' telemetry does not wait for a database."""
        if self.inventory is None:
            return None, None
        try:
            return list(self.inventory.cordons()), list(self.inventory.leases())
        except Exception as exc:  # SQLAlchemy's errors, a database that is down: any of them
            self.stage_errors["inventory"] += 1
            log.warning("telemetry exporter: inventory unreadable: %s", exc)
            return None, None

    @staticmethod
    def _cordons(out: _Families, dev: DeviceInfo, labels: Labels, cordons: Sequence[Any]) -> None:
        mine = [
            c
            for c in cordons
            if c.node == dev.node and (c.index is None or c.device_uuid == dev.uuid)
        ]
        out.add(CORDONED, labels, 1.0 if mine else 0.0)
        for c in mine:
            scope = {"scope": "node" if c.index is None else "device", "reason": c.reason}
            out.add(CORDON_INFO, {**labels, **scope}, 1.0)

    @staticmethod
    def _leases(
        out: _Families,
        dev: DeviceInfo,
        labels: Labels,
        plabels: dict[str, Labels],
        leases: Sequence[Any],
    ) -> None:
        for lease in leases:
            if lease.resource_id == dev.uuid:
                where, kind = labels, "device"
            elif lease.resource_id in plabels:
                where, kind = plabels[lease.resource_id], lease.kind or "partition"
            else:
                continue
            extra = {"owner": lease.owner, "resource_id": lease.resource_id, "kind": kind}
            out.add(LEASE_INFO, {**where, **extra}, 1.0)

    def _stage_failed(self, stage: str, dev: DeviceInfo, exc: Exception) -> None:
        self.stage_errors[stage] += 1
        log.warning("telemetry exporter: %s of %s:%d: %s", stage, dev.node, dev.index, exc)


__all__ = [
    "EXPORTER_FAMILIES",
    "GPUFLOW_FAMILIES",
    "catalogue",
    "family",
    "sample_name",
    "Family",
    "FamilySpec",
    "Snapshot",
    "SnapshotBuilder",
    "check_scope",
]
