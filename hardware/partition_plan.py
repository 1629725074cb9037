"""Declarative partition plans in NVIDIA mig-parted's config format: apply, assert, export.

The format is mig-parted's own ``version: v1`` document, so its files work as they are::

    version: v1
    mig-configs:
      all-balanced:
        - device-filter: ["0x20B010DE"]    # optional: PCI device ids (a string or a list)
          devices: all                      # or a list of device indexes on the node
          mig-enabled: true
          mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}

Faithful to mig-parted (api/spec/v1, cmd/nvidia-mig-parted/{apply,assert,export}):

- ``version`` must be ``v1``; unknown keys are rejected; ``devices`` and ``mig-enabled``
  are required; ``mig-devices`` is required when ``mig-enabled`` is true and must be empty
  when it is false.
- An entry without ``device-filter`` matches every device; a device that no entry matches
  is left alone; when several entries match one device the last one wins (mig-parted walks
  the entries in order and applies each).
- An entry with ``devices: all`` skips devices that cannot do what it asks (mig-parted skips
  non MIG-capable GPUs), so ``all-1g.5gb`` runs on a node that also holds a V100.
- Profile names ``1c.1g.5gb`` and ``1g.5gb`` are the same profile.

Extensions (gpuflow's fleets are many nodes, mixed vendors):

- ``device-filter`` may also name SKUs: full NVML names or the aliases of
  ``hardware.skus.SKU_ALIASES`` (case-insensitive).
- ``nodes: [names]`` restricts an entry to some nodes (absent: every node).
- ``vdcu-devices: [{compute-units: 20, memory-mb: 8192}, ...]`` for Hygon DCUs (such an
  entry implies ``mig-enabled: true`` when it omits it); Hygon MIG goes through
  ``mig-devices`` like NVIDIA MIG.

Where we are stricter than mig-parted: an entry that names devices explicitly (a
``device-filter`` or a list of indexes) and asks a device for something it cannot do (MIG
on a V100) is refused instead of skipped, because that is a mistake in the plan. A filter
with a PCI subsystem id (``0x20B010DE:0x...``) matches on the primary id only: backends do
not report subsystem ids.

The whole plan is validated against every selected device's own profiles and placement
rules before any device is touched; an impossible plan raises :class:`PlanError` and
nothing changes. ``apply_plan`` skips devices already in the desired layout and restores
every device it changed when a step fails half-way.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from gpuflow.hardware.backend import (
    Backend,
    DeviceInfo,
    HardwareError,
    InvalidRequestError,
    Partition,
    PartitionProfile,
    PartitionRequest,
)
from gpuflow.hardware.placement import LayoutError, fit_mig, fit_vdcu
from gpuflow.hardware.skus import SKU_ALIASES, SKUS

PLAN_VERSION = "v1"
EXPORT_CONFIG_NAME = "current"  # mig-parted export's default config label

_TOP_KEYS = ("version", "mig-configs")
_ENTRY_KEYS = ("device-filter", "devices", "mig-enabled", "mig-devices", "nodes", "vdcu-devices")
_VDCU_KEYS = ("compute-units", "memory-mb")
# mig-parted's MigProfile grammar: [<c>c.]<g>g.<gb>gb[+attr[,attr...]]; only "me" is known.
_PROFILE_RE = re.compile(
    r"^(?:(\d+)c\.)?(\d+)g\.(\d+)gb(?:\+([A-Za-z][A-Za-z0-9]*(?:,[A-Za-z][A-Za-z0-9]*)*))?$"
)
_PCI_RE = re.compile(r"^(0[xX][0-9a-fA-F]+|[0-9]+)(?::(0[xX][0-9a-fA-F]+|[0-9]+))?$")


# -- errors --------------------------------------------------------------------------


class PlanError(LayoutError):
    """A plan that cannot be carried out; raised before any device is touched.

    ``device`` is ``node:index (SKU)`` (or ``plan`` when no device is involved), ``rule``
    the rule broken (``max-count``, ``placement``, ``compute-units``, ``no-mig``,
    ``unknown-profile``, ``unknown-config``, ...), ``config``/``entry`` where in the plan.
    ``problems`` holds every error found when several devices are impossible.
    """

    def __init__(
        self,
        device: str | None,
        rule: str,
        detail: str,
        *,
        config: str | None = None,
        entry: int | None = None,
        key: str | None = None,
    ) -> None:
        where = ""
        if config is not None:
            where = f" (config {config!r}" + (f", entry {entry}" if entry is not None else "") + ")"
        super().__init__(device or "plan", rule, detail + where)
        self.detail = detail
        self.config = config
        self.entry = entry
        self.key = key
        self.problems: list[PlanError] = [self]


class PlanFormatError(PlanError):
    """The document is not a valid plan (schema): names the config, entry index and key."""

    def __init__(
        self,
        detail: str,
        *,
        config: str | None = None,
        entry: int | None = None,
        key: str | None = None,
    ) -> None:
        super().__init__(None, "format", detail, config=config, entry=entry, key=key)
        path = "mig-configs" if config is not None else "plan"
        if config is not None:
            path += f".{config}"
        if entry is not None:
            path += f"[{entry}]"
        if key is not None:
            path += f".{key}"
        # Replace LayoutError's "plan: format: ..." with a message that reads as a path.
        self.args = (f"invalid partition plan: {path}: {detail}",)


class PlanApplyError(HardwareError):
    """A step failed half-way through an apply; the devices changed were rolled back."""

    def __init__(
        self,
        message: str,
        *,
        device: str,
        step: str,
        rolled_back: Sequence[str],
        rollback_failures: Mapping[str, str],
    ) -> None:
        super().__init__(message)
        self.device = device
        self.step = step
        self.rolled_back = list(rolled_back)
        self.rollback_failures = dict(rollback_failures)


# -- the plan --------------------------------------------------------------------------


@dataclass(frozen=True)
class VdcuSpec:
    compute_units: int
    memory_mb: int


@dataclass(frozen=True)
class PlanEntry:
    """One entry of a mig-config: which devices, and the layout they should have."""

    devices: Literal["all"] | tuple[int, ...]
    mig_enabled: bool
    device_filter: tuple[str, ...] = ()
    mig_devices: dict[str, int] = field(default_factory=dict)
    nodes: tuple[str, ...] | None = None
    vdcu_devices: tuple[VdcuSpec, ...] = ()

    @property
    def is_generic(self) -> bool:
        """``devices: all`` and no filter: skips devices that cannot do what it asks."""
        return self.devices == "all" and not self.device_filter

    def wanted_mig(self) -> dict[str, int]:
        return {p: n for p, n in self.mig_devices.items() if n > 0}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.device_filter:
            out["device-filter"] = list(self.device_filter)
        out["devices"] = "all" if self.devices == "all" else list(self.devices)
        if self.nodes is not None:
            out["nodes"] = list(self.nodes)
        out["mig-enabled"] = self.mig_enabled
        out["mig-devices"] = dict(self.mig_devices)
        if self.vdcu_devices:
            out["vdcu-devices"] = [
                {"compute-units": v.compute_units, "memory-mb": v.memory_mb}
                for v in self.vdcu_devices
            ]
        return out


@dataclass(frozen=True)
class PartitionPlan:
    configs: dict[str, tuple[PlanEntry, ...]]
    version: str = PLAN_VERSION
    source: str | None = None  # the file it came from, for messages

    def config(self, name: str | None = None) -> tuple[str, tuple[PlanEntry, ...]]:
        """The named config; with no name, the only one (as mig-parted's -c is optional)."""
        if name is None:
            if len(self.configs) != 1:
                raise PlanError(
                    None,
                    "config-required",
                    f"the plan holds {len(self.configs)} configs "
                    f"({', '.join(sorted(self.configs))}); name one",
                )
            name = next(iter(self.configs))
        if name not in self.configs:
            raise PlanError(
                None,
                "unknown-config",
                f"no config {name!r} in the plan; it has: {', '.join(sorted(self.configs))}",
            )
        return name, self.configs[name]

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "mig-configs": {n: [e.to_dict() for e in es] for n, es in self.configs.items()},
        }


def _fmt(
    detail: str, config: str | None = None, entry: int | None = None, key: str | None = None
) -> PlanFormatError:
    return PlanFormatError(detail, config=config, entry=entry, key=key)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def normalize_profile(name: str) -> str:
    """mig-parted's normal form: ``1c.1g.5gb`` -> ``1g.5gb``; raises ValueError if malformed."""
    m = _PROFILE_RE.match(name)
    if not m:
        raise ValueError(f"{name!r} is not a MIG profile name like '1g.5gb' or '1c.2g.10gb'")
    c, g, gb, attrs = m.groups()
    if attrs:
        parts = attrs.split(",")
        if len(set(parts)) != len(parts):
            raise ValueError(f"{name!r} repeats an attribute")
        unknown = [a for a in parts if a != "me"]
        if unknown:
            raise ValueError(f"{name!r}: unknown MIG profile attribute {unknown[0]!r} (known: me)")
    suffix = f"+{attrs}" if attrs else ""
    if c is None or int(c) == int(g):
        return f"{int(g)}g.{int(gb)}gb{suffix}"
    return f"{int(c)}c.{int(g)}g.{int(gb)}gb{suffix}"


def _parse_entry(raw: Any, config: str, i: int) -> PlanEntry:
    if not isinstance(raw, Mapping):
        raise _fmt(f"an entry must be a mapping, got {type(raw).__name__}", config, i)
    for k in raw:
        if k not in _ENTRY_KEYS:
            raise _fmt(
                f"unexpected field {k!r} (allowed: {', '.join(_ENTRY_KEYS)})", config, i, str(k)
            )
    # mig-parted requires mig-enabled; an entry with vdcu-devices (our extension) implies it.
    required = ("devices",) if "vdcu-devices" in raw else ("devices", "mig-enabled")
    for k in required:
        if k not in raw:
            raise _fmt("missing required field", config, i, k)

    filt: tuple[str, ...] = ()
    df = raw.get("device-filter")
    if df is not None:
        items = [df] if isinstance(df, (str, int)) else df
        if isinstance(items, list):
            # An unquoted 0x20B010DE is an int to YAML; take it back as the id it was.
            items = [f"0x{s:08X}" if _is_int(s) and s >= 0 else s for s in items]
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise _fmt(
                "must be a PCI device id / SKU name or a list of them", config, i, "device-filter"
            )
        filt = tuple(s.strip() for s in items if s.strip())
        for s in filt:
            if ":" in s and not _PCI_RE.match(s):
                raise _fmt(
                    f"{s!r} is not a PCI device id like '0x20B010DE'", config, i, "device-filter"
                )

    devices = raw["devices"]
    if isinstance(devices, str):
        if devices != "all":
            raise _fmt(
                f"must be 'all' or a list of device indexes, got {devices!r}", config, i, "devices"
            )
        devs: Literal["all"] | tuple[int, ...] = "all"
    elif isinstance(devices, list) and all(_is_int(d) and d >= 0 for d in devices):
        devs = tuple(devices)
    else:
        raise _fmt(
            f"must be 'all' or a list of device indexes (ints >= 0), got {devices!r}",
            config,
            i,
            "devices",
        )

    enabled = raw.get("mig-enabled", True)
    if not isinstance(enabled, bool):
        raise _fmt(f"must be true or false, got {enabled!r}", config, i, "mig-enabled")

    mig: dict[str, int] = {}
    md = raw.get("mig-devices")
    if md is not None:
        if not isinstance(md, Mapping):
            raise _fmt("must be a mapping of MIG profile to count", config, i, "mig-devices")
        for name, count in md.items():
            if not isinstance(name, str):
                raise _fmt(f"profile {name!r} must be a string", config, i, "mig-devices")
            try:
                norm = normalize_profile(name)
            except ValueError as e:
                raise _fmt(str(e), config, i, "mig-devices") from None
            if not _is_int(count) or count < 0:
                raise _fmt(
                    f"count for {name!r} must be an integer >= 0, got {count!r}",
                    config,
                    i,
                    "mig-devices",
                )
            mig[norm] = mig.get(norm, 0) + count

    vdcus: list[VdcuSpec] = []
    vd = raw.get("vdcu-devices")
    if vd is not None:
        if not isinstance(vd, list):
            raise _fmt("must be a list of {compute-units, memory-mb}", config, i, "vdcu-devices")
        for j, v in enumerate(vd):
            key = f"vdcu-devices[{j}]"
            if not isinstance(v, Mapping):
                raise _fmt("must be a mapping {compute-units: int, memory-mb: int}", config, i, key)
            for k in v:
                if k not in _VDCU_KEYS:
                    raise _fmt(
                        f"unexpected field {k!r} (allowed: {', '.join(_VDCU_KEYS)})", config, i, key
                    )
            for k in _VDCU_KEYS:
                if k not in v:
                    raise _fmt(f"missing required field {k!r}", config, i, key)
                if not _is_int(v[k]) or v[k] < 1:
                    raise _fmt(f"{k} must be an integer >= 1, got {v[k]!r}", config, i, key)
            vdcus.append(VdcuSpec(compute_units=v["compute-units"], memory_mb=v["memory-mb"]))

    nodes: tuple[str, ...] | None = None
    if "nodes" in raw:
        ns = raw["nodes"]
        if not isinstance(ns, list) or not ns or not all(isinstance(n, str) and n for n in ns):
            raise _fmt("must be a non-empty list of node names", config, i, "nodes")
        nodes = tuple(ns)

    if enabled and md is None and vd is None:
        raise _fmt(
            "required when 'mig-enabled' is true (use {} for none)", config, i, "mig-devices"
        )
    if not enabled and mig:
        raise _fmt("MIG devices included when 'mig-enabled' is false", config, i, "mig-devices")
    if not enabled and vdcus:
        raise _fmt("vDCUs included when 'mig-enabled' is false", config, i, "vdcu-devices")
    return PlanEntry(
        devices=devs,
        mig_enabled=enabled,
        device_filter=filt,
        mig_devices=mig,
        nodes=nodes,
        vdcu_devices=tuple(vdcus),
    )


def parse_plan(doc: Any, source: str | None = None) -> PartitionPlan:
    """Validate a parsed document (dict) as a plan."""
    if not isinstance(doc, Mapping):
        raise _fmt(
            f"a plan must be a mapping with 'version' and 'mig-configs', got {type(doc).__name__}"
        )
    for k in doc:
        if k not in _TOP_KEYS:
            raise _fmt(f"unexpected field {k!r} (allowed: {', '.join(_TOP_KEYS)})", key=str(k))
    if "version" not in doc:
        raise _fmt("missing required field", key="version")
    if doc["version"] != PLAN_VERSION:
        raise _fmt(f"unknown version {doc['version']!r} (supported: {PLAN_VERSION})", key="version")
    configs_raw = doc.get("mig-configs")
    if not isinstance(configs_raw, Mapping) or not configs_raw:
        raise _fmt("at least one config is required", key="mig-configs")
    configs: dict[str, tuple[PlanEntry, ...]] = {}
    for name, entries in configs_raw.items():
        name = str(name)
        if not isinstance(entries, list) or not entries:
            raise _fmt("must be a non-empty list of entries", name)
        configs[name] = tuple(_parse_entry(e, name, i) for i, e in enumerate(entries))
    return PartitionPlan(configs=configs, version=PLAN_VERSION, source=source)


def _looks_like_path(s: str) -> bool:
    if "\n" in s:
        return False
    if s.endswith((".yaml", ".yml", ".json")):
        return True
    try:
        return Path(s).is_file()
    except (OSError, ValueError):  # a name too long or odd to be a file: it is text
        return False


def load_plan(path_or_text: str | Path | Mapping[str, Any]) -> PartitionPlan:
    """Load and validate a plan from a file path, YAML/JSON text, or an already parsed dict."""
    if isinstance(path_or_text, Mapping):
        return parse_plan(path_or_text)
    source: str | None = None
    if isinstance(path_or_text, Path) or _looks_like_path(path_or_text):
        path = Path(path_or_text)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise InvalidRequestError(f"cannot read partition plan {str(path)!r}: {e}") from e
        source = str(path)
    else:
        text = path_or_text
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise _fmt(f"not valid YAML: {e}") from e
    return parse_plan(doc, source=source)


# -- layouts ---------------------------------------------------------------------------


def _req_key(r: PartitionRequest) -> tuple[Any, ...]:
    if r.profile == "vdcu":
        return ("vdcu", r.compute_units, r.memory_mb)
    return ("mig", r.profile)


@dataclass(frozen=True)
class DeviceLayout:
    """One device's partition layout: MIG mode and its partitions (MIG with placements)."""

    node: str
    index: int
    sku: str
    mig_enabled: bool
    partitions: tuple[PartitionRequest, ...] = ()
    entry: int | None = field(default=None, compare=False)  # plan entry it came from

    @property
    def device_id(self) -> str:
        return f"{self.node}:{self.index}"

    @property
    def label(self) -> str:
        return f"{self.node}:{self.index} ({self.sku})"

    def mig_counts(self) -> dict[str, int]:
        return dict(
            sorted(Counter(r.profile for r in self.partitions if r.profile != "vdcu").items())
        )

    def vdcu_sizes(self) -> list[tuple[int, int]]:
        """(compute_units, memory_mb) of each vDCU, sorted."""
        return sorted(
            (r.compute_units or 0, r.memory_mb or 0) for r in self.partitions if r.profile == "vdcu"
        )

    def same_as(self, other: DeviceLayout) -> bool:
        """Same mode and same multiset of partitions; MIG placements need not match."""
        return self.mig_enabled == other.mig_enabled and Counter(
            map(_req_key, self.partitions)
        ) == Counter(map(_req_key, other.partitions))

    def describe(self) -> str:
        """Short and free of square brackets (Rich reads those as markup): 'off',
        'on (no partitions)', 'on: 3g.20gb@4, 2g.10gb@0, 2x 1g.5gb@2,3', 'on: 2x vdcu 20cu/8192MiB'.
        """
        if not self.mig_enabled:
            return "off"
        if not self.partitions:
            return "on (no partitions)"
        groups: dict[str, list[str]] = {}
        for r in self.partitions:
            if r.profile == "vdcu":
                groups.setdefault(f"vdcu {r.compute_units}cu/{r.memory_mb}MiB", []).append("")
            else:
                start = "" if r.placement_start is None else str(r.placement_start)
                groups.setdefault(r.profile, []).append(start)
        parts = []
        for name, starts in groups.items():
            where = ",".join(s for s in starts if s)
            text = f"{name}@{where}" if where else name
            parts.append(text if len(starts) == 1 else f"{len(starts)}x {text}")
        return "on: " + ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "index": self.index,
            "sku": self.sku,
            "mig_enabled": self.mig_enabled,
            "mig_devices": self.mig_counts(),
            "vdcu_devices": [{"compute_units": c, "memory_mb": m} for c, m in self.vdcu_sizes()],
            "partitions": [
                {k: v for k, v in vars(r).items() if v is not None} for r in self.partitions
            ],
        }


def _exactly_same(a: DeviceLayout, b: DeviceLayout) -> bool:
    """Same mode and same partitions including MIG placements (order aside)."""
    return a.mig_enabled == b.mig_enabled and Counter(a.partitions) == Counter(b.partitions)


def _parse_pci(s: str) -> int | None:
    m = _PCI_RE.match(s)
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


def _check_nodes(backend: Backend, nodes: Sequence[str] | None) -> list[DeviceInfo]:
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
            _PROFILE_RE.match(p) and "c." in p for p in wanted_mig
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
) -> list[DeviceLayout]:
    """The desired layout of every device ``config`` selects, validated; touches nothing.

    Raises PlanError (with every problem in ``.problems``) if any device cannot take its
    layout. Devices no entry selects are absent from the result (left alone).
    """
    name, entries = plan.config(config)
    out: list[DeviceLayout] = []
    problems: list[PlanError] = []
    for dev in _check_nodes(backend, nodes):
        # Last matching entry wins, but a generic entry that skips a device does not
        # override an earlier entry that applied to it.
        profiles: list[PartitionProfile] | None = None
        layout: DeviceLayout | None = None
        for i, e in reversed(list(enumerate(entries))):
            if not _entry_selects(e, dev):
                continue
            if profiles is None:
                profiles = backend.partition_profiles(dev.node, dev.index)
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


def current_layout(backend: Backend, dev: DeviceInfo) -> DeviceLayout:
    """What the device holds now (a device with no partition profiles is 'disabled')."""
    if not backend.partition_profiles(dev.node, dev.index):
        return DeviceLayout(dev.node, dev.index, dev.sku, False, ())
    enabled = backend.partition_mode(dev.node, dev.index)
    parts = backend.partitions(dev.node, dev.index)
    return DeviceLayout(dev.node, dev.index, dev.sku, enabled, tuple(_as_request(p) for p in parts))


def _as_request(p: Partition) -> PartitionRequest:
    if p.kind == "vdcu":
        return PartitionRequest(
            profile="vdcu", compute_units=p.compute_units, memory_mb=p.memory_mb
        )
    return PartitionRequest(profile=p.profile, placement_start=p.placement_start)


# -- apply -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceChange:
    node: str
    index: int
    sku: str
    changed: bool
    before: DeviceLayout
    after: DeviceLayout

    @property
    def before_summary(self) -> str:
        return self.before.describe()

    @property
    def after_summary(self) -> str:
        return self.after.describe()

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "index": self.index,
            "sku": self.sku,
            "changed": self.changed,
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
        }


@dataclass(frozen=True)
class ApplyReport:
    config: str
    devices: tuple[DeviceChange, ...]

    @property
    def changed(self) -> list[DeviceChange]:
        return [d for d in self.devices if d.changed]

    @property
    def unchanged(self) -> list[DeviceChange]:
        return [d for d in self.devices if not d.changed]

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "devices": [d.to_dict() for d in self.devices]}


def _set_layout(
    backend: Backend, dev: DeviceInfo, have: DeviceLayout, want: DeviceLayout, step: list[str]
) -> None:
    """Move one device from ``have`` to ``want``; ``step`` records the step under way."""
    if have.partitions:
        step[0] = "destroying its partitions"
        backend.destroy_partitions(dev.node, dev.index)
    if have.mig_enabled != want.mig_enabled:
        step[0] = f"{'enabling' if want.mig_enabled else 'disabling'} partitioning (MIG mode)"
        backend.set_partition_mode(dev.node, dev.index, want.mig_enabled)
    if want.partitions:
        step[0] = "creating " + want.describe().removeprefix("on: ")
        backend.create_partitions(dev.node, dev.index, list(want.partitions))


def apply_plan(
    backend: Backend,
    plan: PartitionPlan,
    config: str | None = None,
    nodes: Sequence[str] | None = None,
) -> ApplyReport:
    """Bring every device ``config`` selects to its layout; all or nothing.

    Devices already in their layout are not touched. If a step fails, every device this
    apply changed gets back the layout it had (same placements) and PlanApplyError says
    what failed and what was restored.
    """
    name, _ = plan.config(config)
    desired = plan_layouts(backend, plan, name, nodes)  # validates the whole plan first
    devs = {(d.node, d.index): d for d in _check_nodes(backend, nodes)}
    befores = {(w.node, w.index): current_layout(backend, devs[(w.node, w.index)]) for w in desired}

    touched: list[tuple[DeviceInfo, DeviceLayout]] = []  # (device, snapshot) in change order
    results: list[DeviceChange] = []
    for want in desired:
        dev = devs[(want.node, want.index)]
        before = befores[(want.node, want.index)]
        if before.same_as(want):
            results.append(DeviceChange(dev.node, dev.index, dev.sku, False, before, before))
            continue
        step = ["reading its layout"]
        touched.append((dev, before))
        try:
            _set_layout(backend, dev, before, want, step)
            step[0] = "verifying the new layout"
            after = current_layout(backend, dev)
            if not after.same_as(want):
                raise HardwareError(
                    f"the device reports {after.describe()}, wanted {want.describe()}"
                )
        except Exception as exc:
            raise _rollback(backend, name, dev, step[0], exc, touched) from exc
        results.append(DeviceChange(dev.node, dev.index, dev.sku, True, before, after))
    return ApplyReport(config=name, devices=tuple(results))


def _rollback(
    backend: Backend,
    config: str,
    failed: DeviceInfo,
    step: str,
    exc: BaseException,
    touched: list[tuple[DeviceInfo, DeviceLayout]],
) -> PlanApplyError:
    restored: list[str] = []
    failures: dict[str, str] = {}
    for dev, snapshot in reversed(touched):
        did = f"{dev.node}:{dev.index}"
        try:
            now = current_layout(backend, dev)
            if not _exactly_same(now, snapshot):  # placements too: restore what was there
                _set_layout(backend, dev, now, snapshot, ["rollback"])
            restored.append(did)
        except Exception as rb_exc:  # keep going: restore as many devices as we can
            failures[did] = f"{type(rb_exc).__name__}: {rb_exc}"
    label = f"{failed.node}:{failed.index} ({failed.sku})"
    msg = (
        f"applying partition config {config!r} failed on {label} while {step}: "
        f"{type(exc).__name__}: {exc}; "
    )
    if restored:
        msg += f"rolled back {len(restored)} device(s) to their previous layout ({', '.join(reversed(restored))})"
    if failures:
        msg += (
            ("; " if restored else "")
            + "ROLLBACK FAILED on "
            + "; ".join(f"{d}: {why}" for d, why in failures.items())
        )
    return PlanApplyError(
        msg,
        device=label,
        step=step,
        rolled_back=list(reversed(restored)),
        rollback_failures=failures,
    )


# -- assert ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Mismatch:
    node: str
    index: int
    sku: str
    key: str  # "mig-enabled" | "mig-devices" | "vdcu-devices"
    expected: Any
    actual: Any

    def __str__(self) -> str:
        return f"{self.node}:{self.index} ({self.sku}): {self.key} is {self.actual!r}, plan wants {self.expected!r}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "index": self.index,
            "sku": self.sku,
            "key": self.key,
            "expected": self.expected,
            "actual": self.actual,
        }


def assert_plan(
    backend: Backend,
    plan: PartitionPlan,
    config: str | None = None,
    nodes: Sequence[str] | None = None,
) -> list[Mismatch]:
    """How the devices differ from ``config``; empty when they match (placements aside)."""
    name, _ = plan.config(config)
    desired = plan_layouts(backend, plan, name, nodes)
    devs = {(d.node, d.index): d for d in _check_nodes(backend, nodes)}
    out: list[Mismatch] = []
    for want in desired:
        have = current_layout(backend, devs[(want.node, want.index)])
        if have.mig_enabled != want.mig_enabled:
            out.append(
                Mismatch(
                    want.node,
                    want.index,
                    want.sku,
                    "mig-enabled",
                    want.mig_enabled,
                    have.mig_enabled,
                )
            )
            if not want.mig_enabled:
                continue
        if have.mig_counts() != want.mig_counts():
            out.append(
                Mismatch(
                    want.node,
                    want.index,
                    want.sku,
                    "mig-devices",
                    want.mig_counts(),
                    have.mig_counts(),
                )
            )
        if have.vdcu_sizes() != want.vdcu_sizes():
            out.append(
                Mismatch(
                    want.node,
                    want.index,
                    want.sku,
                    "vdcu-devices",
                    want.vdcu_sizes(),
                    have.vdcu_sizes(),
                )
            )
    return out


# -- export ----------------------------------------------------------------------------


def export_layout(
    backend: Backend, nodes: Sequence[str] | None = None, config_name: str = EXPORT_CONFIG_NAME
) -> dict[str, Any]:
    """The current layout as a plan document, one entry per device (config ``current``).

    Applying the export to the same fleet changes nothing.
    """
    entries: list[dict[str, Any]] = []
    for dev in _check_nodes(backend, nodes):
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


def dump_yaml(doc: Mapping[str, Any] | PartitionPlan) -> str:
    """A plan document as YAML in mig-parted's style (short lists and maps inline)."""
    if isinstance(doc, PartitionPlan):
        doc = doc.to_dict()
    return yaml.safe_dump(dict(doc), sort_keys=False, default_flow_style=None, width=100)


__all__ = [
    "ApplyReport",
    "DeviceChange",
    "DeviceLayout",
    "Mismatch",
    "PartitionPlan",
    "PlanApplyError",
    "PlanEntry",
    "PlanError",
    "PlanFormatError",
    "VdcuSpec",
    "apply_plan",
    "assert_plan",
    "current_layout",
    "dump_yaml",
    "export_layout",
    "load_plan",
    "normalize_profile",
    "parse_plan",
    "plan_layouts",
]
