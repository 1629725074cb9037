"""The partition plan: NVIDIA mig-parted's config format (spec v1), parsed and validated.

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
- Profile names ``1c.1g.5gb`` and ``1g.5gb`` are the same profile; attributes follow as
  go-nvlib writes them (``1g.5gb+me``, ``1g.24gb+me.all``, ``1g.24gb+gfx``, ``1g.24gb-me``),
  so NVIDIA's own config-default.yaml loads as it is. A name is checked against a device
  only when a config asks that device for it.

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
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.placement import LayoutError

PLAN_VERSION = "v1"

_TOP_KEYS = ("version", "mig-configs")
_ENTRY_KEYS = ("device-filter", "devices", "mig-enabled", "mig-devices", "nodes", "vdcu-devices")
_VDCU_KEYS = ("compute-units", "memory-mb")
# go-nvlib's MIG profile grammar (pkg/nvlib/device/mig_profile.go, what mig-parted parses
# with): [<c>c.]<g>g.<gb>gb, then +attr[,attr...] or -attr[,attr...] (never both); an
# attribute starts with a letter, holds letters, digits and dots, and does not end in a
# dot ("me", "me.all", "gfx"). Which attributes exist is the device's business: a name
# is checked against the profiles of a device a config asks for it (select.py).
_ATTR = r"[A-Za-z](?:[A-Za-z0-9.]*[A-Za-z0-9])?"
PROFILE_RE = re.compile(rf"^(?:(\d+)c\.)?(\d+)g\.(\d+)gb(?:([+-])({_ATTR}(?:,{_ATTR})*))?$")
PCI_RE = re.compile(r"^(0[xX][0-9a-fA-F]+|[0-9]+)(?::(0[xX][0-9a-fA-F]+|[0-9]+))?$")


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
    """mig-parted's normal form: ``1c.1g.5gb`` -> ``1g.5gb``, ``1g.24gb+gfx`` and
    ``1g.24gb-me`` as they are; raises ValueError if malformed."""
    m = PROFILE_RE.match(name)
    if not m:
        raise ValueError(
            f"{name!r} is not a MIG profile name like '1g.5gb', '1c.2g.10gb', '1g.5gb+me' or "
            "'1g.24gb-me'"
        )
    c, g, gb, sign, attrs = m.groups()
    if attrs:
        parts = attrs.split(",")
        if len(set(parts)) != len(parts):
            raise ValueError(f"{name!r} repeats an attribute")
    suffix = f"{sign}{attrs}" if attrs else ""
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
            if ":" in s and not PCI_RE.match(s):
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


def dump_yaml(doc: Mapping[str, Any] | PartitionPlan) -> str:
    """A plan document as YAML in mig-parted's style (short lists and maps inline)."""
    if isinstance(doc, PartitionPlan):
        doc = doc.to_dict()
    return yaml.safe_dump(dict(doc), sort_keys=False, default_flow_style=None, width=100)
