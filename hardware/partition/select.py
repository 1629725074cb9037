"""Which devices a plan selects, and the layout it asks of each, validated; touches nothing.

An entry selects a device by node, index and ``device-filter`` (PCI id or SKU); the last
matching entry wins, and a generic entry (``devices: all``, no filter) skips a device that
cannot do what it asks instead of refusing it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gpuflow.hardware.backend import (
    Backend,
    DeviceInfo,
    DeviceLostError,
    PartitionProfile,
    PartitionRequest,
)
from gpuflow.hardware.partition.layout import DeviceLayout
from gpuflow.hardware.partition.spec import PCI_RE, PROFILE_RE, PartitionPlan, PlanEntry, PlanError
from gpuflow.hardware.placement import LayoutError, fit_mig, fit_vdcu
from gpuflow.hardware.skus import SKU_ALIASES, SKUS

log = logging.getLogger(__name__)


def _parse_pci(s: str) -> int | None:
    m = PCI_RE.match(s)
    if not m:
        return None
    return int(m.group(1), 0)


def _filter_matches(filt: str, dev: DeviceInfo) -> bool:
    pci = _parse_pci(filt)
    if pci is not None:
        return dev.pci_device_id is not None and _parse_pci(dev.pci_device_id) == pci
    alias = SKU_ALIASES.get(filt.lower())
    if alias is not None:
        return dev.sku == alias
    # A full name: exact like NVML reports it; case-insensitive for names we tabulate.
    if filt == dev.sku:
        return True
    return filt.lower() == dev.sku.lower() and dev.sku in SKUS


def _entry_selects(e: PlanEntry, dev: DeviceInfo) -> bool:
    if e.nodes is not None and dev.node not in e.nodes:
        return False
    if e.device_filter and not any(_filter_matches(f, dev) for f in e.device_filter):
        return False
    return e.devices == "all" or dev.index in e.devices


def select_devices(backend: Backend, nodes: Sequence[str] | None) -> list[DeviceInfo]:
    """The devices of ``nodes`` (every node when None); an unknown node is a PlanError."""
    infos = backend.discover()
    if nodes is None:
        return [d for n in infos for d in n.devices]
    if isinstance(nodes, str):
        nodes = [nodes]
    known = {n.name for n in infos}
    unknown = [n for n in nodes if n not in known]
    if unknown:
        raise PlanError(
            None,
            "unknown-node",
            f"no node {', '.join(map(repr, unknown))} on backend {backend.name!r} "
            f"(nodes: {', '.join(sorted(known))})",
        )
    wanted = set(nodes)
    return [d for n in infos if n.name in wanted for d in n.devices]


def _desired(
    e: PlanEntry, i: int, config: str, dev: DeviceInfo, profiles: Sequence[PartitionProfile]
) -> DeviceLayout | None:
    """The layout entry ``e`` asks of ``dev``, validated; None when a generic entry skips it."""
    label = f"{dev.node}:{dev.index} ({dev.sku})"
    mig_profiles = [p for p in profiles if p.kind == "mig"]
    vdcu_profile = next((p for p in profiles if p.kind == "vdcu"), None)
    wanted_mig = e.wanted_mig()

    def refuse(rule: str, detail: str) -> PlanError:
        return PlanError(label, rule, detail, config=config, entry=i)

    if not e.mig_enabled:
        return DeviceLayout(dev.node, dev.index, dev.sku, False, (), entry=i)
    if dev.vendor == "Hygon" and profiles and not wanted_mig and not e.vdcu_devices:
        # hy-smi has no per-DCU mode to switch on: `hy-smi virtual` carves vDCUs with no
        # mode, and Hygon's MIG mode is node-wide and the operator's. A DCU reads as
        # partitioned exactly while it has vDCUs or MIG instances (HygonBackend and the
        # twin alike), so "on with nothing carved" can be neither applied nor asserted.
        if e.is_generic:
            return None  # as mig-parted's "all-enabled" skips what it cannot set up
        raise refuse(
            "no-partition-mode",
            "a Hygon DCU has no partition mode of its own: hy-smi reports it partitioned "
            "only while it has vDCUs or MIG instances; list vdcu-devices or mig-devices "
            "for it, or set mig-enabled: false",
        )
    use_mig = bool(wanted_mig) and bool(mig_profiles)
    use_vdcu = bool(e.vdcu_devices) and vdcu_profile is not None
    impossible = (
        not profiles
        or (wanted_mig and not use_mig and not use_vdcu)
        or (e.vdcu_devices and not use_vdcu and not use_mig)
    )
    if impossible:
        if e.is_generic:
            return None  # as mig-parted skips non MIG-capable GPUs under "devices: all"
        if not profiles:
            raise refuse("no-mig", "this device supports neither MIG nor virtual devices")
        if wanted_mig and not mig_profiles:
            raise refuse("no-mig", "this device does not support MIG")
        raise refuse("no-vdcu", "this device does not support virtual DCUs")
    if use_mig and use_vdcu:
        raise refuse(
            "mig-and-vdcu", "the entry asks this device for MIG instances and vDCUs at once"
        )
    if use_mig:
        # Counts bounded before any list of them is built: a count of millions is refused
        # at once, naming the profile, not after building millions of requests.
        offered = {p.name: p.max_count for p in mig_profiles}
        for name, n in wanted_mig.items():
            if name in offered and n > offered[name]:
                raise refuse(
                    "max-count", f"{n} x {name} requested, at most {offered[name]} per device"
                )
        if sum(wanted_mig.values()) > max(offered.values(), default=0):
            raise refuse(
                "max-count",
                f"{sum(wanted_mig.values())} MIG instances requested, at most "
                f"{max(offered.values(), default=0)} fit one device",
            )
    try:
        if use_mig:
            # Canonical order (largest first) so the layout, and its placements, are stable.
            names = sorted(
                (p for p, n in wanted_mig.items() for _ in range(n)),
                key=lambda p: (-_profile_size(mig_profiles, p), p),
            )
            reqs = fit_mig(label, mig_profiles, [PartitionRequest(profile=p) for p in names])
        elif use_vdcu:
            assert vdcu_profile is not None
            reqs = fit_vdcu(
                label,
                vdcu_profile.max_count,
                vdcu_profile.compute_slices,
                vdcu_profile.memory_mb,
                [
                    PartitionRequest(
                        profile="vdcu", compute_units=v.compute_units, memory_mb=v.memory_mb
                    )
                    for v in e.vdcu_devices
                ],
            )
        else:
            reqs = []
    except PlanError:
        raise
    except LayoutError as err:
        detail = str(err).removeprefix(f"{err.device}: {err.rule}: ")
        if err.rule == "unknown-profile" and any(
            PROFILE_RE.match(p) and "c." in p for p in wanted_mig
        ):
            detail += " (compute-instance profiles like '1c.2g.10gb' are not supported)"
        raise refuse(err.rule, detail) from None
    return DeviceLayout(dev.node, dev.index, dev.sku, True, tuple(reqs), entry=i)


def _profile_size(profiles: Sequence[PartitionProfile], name: str) -> int:
    for p in profiles:
        if p.name == name:
            return p.placement_size * 16 + p.compute_slices
    return 0  # unknown: fit_mig reports it


def plan_layouts(
    backend: Backend,
    plan: PartitionPlan,
    config: str | None = None,
    nodes: Sequence[str] | None = None,
    lost: list[str] | None = None,
) -> list[DeviceLayout]:
    """The desired layout of every device ``config`` selects, validated; touches nothing.

    Raises PlanError (with every problem in ``.problems``) if any device cannot take its
    layout. Devices no entry selects are absent from the result (left alone). A device
    that fell off the bus is skipped, as NVML leaves a lost GPU out, and named in ``lost``
    when given: one dead GPU must not block a plan for the rest of the fleet.
    """
    name, entries = plan.config(config)
    out: list[DeviceLayout] = []
    problems: list[PlanError] = []
    for dev in select_devices(backend, nodes):
        # Last matching entry wins, but a generic entry that skips a device does not
        # override an earlier entry that applied to it.
        profiles: list[PartitionProfile] | None = None
        layout: DeviceLayout | None = None
        for i, e in reversed(list(enumerate(entries))):
            if not _entry_selects(e, dev):
                continue
            if profiles is None:
                try:
                    profiles = backend.partition_profiles(dev.node, dev.index)
                except DeviceLostError as exc:
                    log.warning("skipping %s:%d (%s): %s", dev.node, dev.index, dev.sku, exc)
                    if lost is not None:
                        lost.append(f"{dev.node}:{dev.index}")
                    break
            try:
                layout = _desired(e, i, name, dev, profiles)
            except PlanError as err:
                problems.append(err)
                break
            if layout is not None:
                break
        if layout is not None:
            out.append(layout)
    if problems:
        first = problems[0]
        if len(problems) > 1:
            first.args = (f"{first.args[0]} (and {len(problems) - 1} more problem(s))",)
        first.problems = problems
        raise first
    return out
