"""The twin's fleet description: a small YAML file of nodes, devices and a seed.

Format (see hardware/data/default_cluster.yaml)::

    name: gpuflow-default
    seed: 20261130
    faults:                      # optional; every key optional (hardware.sim.hazard defaults)
      natural: true              # draw natural failures from the hazard model
      rate_per_node_day: 0.0065
      lemon_fraction: 0.005       # any HazardModel field: repeat_factor, hbm_silent_share, ...
      lemon_factor: 20
    workload_defaults:           # optional: the character of a tenant that reports none
      memory_bound_ratio: 0.39   # share of its time that does not scale with the SM clock
      activity: 1.0              # its switching power at full load (1: the SKU's max limit)
    nodes:
      - name: a100-0
        region: cn-north
        role: active             # active | spare
        ambient_c: 30            # optional inlet temperature of the node
        devices: [{sku: a100-40gb, count: 4}]

Validation happens here, all of it, so the twin never starts from a spec it cannot run;
every error names the file, the node and the field.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.sim.hazard import HazardModel
from gpuflow.hardware.skus import SkuSpec, sku

DEFAULT_AMBIENT_C = 30.0  # estimate: data-centre inlet air plus the sensor's offset at idle
# The character of a tenant that reports none (Backend.report_workload, hardware.sim.
# dvfs_model). m: the median of the GPU-bound workloads of the V100 fit (tasks.energy.
# twin_fit over the Zeus trace; they range 0.0-0.94, falling with batch size). activity:
# the calibration workload (full load at max clock draws the max power limit), the heaviest
# case; the fit's median is 0.72. On a SKU with a fitted curve the cap headroom (the
# average power a binding limit leaves, 0.91 of it on the V100) then holds such a tenant a
# little below f_max even at the max limit ("SwPowerCap", as heavy jobs show on real V100s).
DEFAULT_MEMORY_BOUND_RATIO = 0.39
DEFAULT_ACTIVITY = 1.0
_TOP_KEYS = {"name", "seed", "nodes", "faults", "workload_defaults"}
_WORKLOAD_KEYS = {"memory_bound_ratio", "activity"}
_NODE_KEYS = {"name", "region", "role", "devices", "ambient_c"}
_GROUP_KEYS = {"sku", "count"}
# Every knob of the hazard model (hardware.sim.hazard.HazardModel: rates, class mix,
# lemons, repeat factor, silent HBM share, error levels, stalls, heals) can be set here.
_FAULT_KEYS = {"natural"} | {f.name for f in fields(HazardModel)}


class ClusterSpecError(InvalidRequestError):
    """A cluster spec that cannot describe a fleet; the message names the field."""


@dataclass(frozen=True)
class DeviceGroup:
    sku: str  # the full SKU name (aliases are resolved on load)
    count: int


@dataclass(frozen=True)
class NodeSpec:
    name: str
    region: str
    role: str
    devices: tuple[DeviceGroup, ...]
    ambient_c: float = DEFAULT_AMBIENT_C

    def device_skus(self) -> list[str]:
        """SKU name per device index on this node."""
        return [g.sku for g in self.devices for _ in range(g.count)]


@dataclass(frozen=True)
class FaultSettings:
    natural: bool = True
    hazard: HazardModel = field(default_factory=HazardModel)


@dataclass(frozen=True)
class WorkloadDefaults:
    """The character (dvfs_model) of a tenant that reports none."""

    memory_bound_ratio: float = DEFAULT_MEMORY_BOUND_RATIO
    activity: float = DEFAULT_ACTIVITY


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    seed: int
    nodes: tuple[NodeSpec, ...]
    faults: FaultSettings = field(default_factory=FaultSettings)
    source: str = "<packaged default>"
    workload_defaults: WorkloadDefaults = field(default_factory=WorkloadDefaults)

    def device_slots(self) -> list[tuple[str, int, SkuSpec]]:
        """(node, index, sku) for every device, in spec order (the device ordinal)."""
        return [
            (n.name, i, sku(name)) for n in self.nodes for i, name in enumerate(n.device_skus())
        ]

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise InvalidRequestError(
            f"no node {name!r} in cluster {self.name!r}; nodes: {', '.join(n.name for n in self.nodes)}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The canonical content (no source path): what "the same spec" means."""
        d = asdict(self)
        d.pop("source")
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<state>") -> ClusterSpec:
        faults = data.get("faults") or {}
        hazard = HazardModel(**(faults.get("hazard") or {}))
        return cls(
            name=data["name"],
            seed=int(data["seed"]),
            nodes=tuple(
                NodeSpec(
                    name=n["name"],
                    region=n["region"],
                    role=n["role"],
                    devices=tuple(DeviceGroup(**g) for g in n["devices"]),
                    ambient_c=float(n.get("ambient_c", DEFAULT_AMBIENT_C)),
                )
                for n in data["nodes"]
            ),
            faults=FaultSettings(natural=bool(faults.get("natural", True)), hazard=hazard),
            source=source,
            # States written before workload characters existed have no such key.
            workload_defaults=WorkloadDefaults(**(data.get("workload_defaults") or {})),
        )


def _fail(source: str, where: str, what: str) -> ClusterSpecError:
    return ClusterSpecError(f"cluster spec {source}: {where}: {what}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _unknown(keys: set[str], allowed: set[str]) -> str:
    return f"unknown key(s) {sorted(keys - allowed)}; allowed: {sorted(allowed)}"


def parse_cluster_spec(data: object, source: str = "<memory>") -> ClusterSpec:
    """Validate a parsed YAML document and build the spec; raises ClusterSpecError."""
    if not isinstance(data, dict):
        raise _fail(source, "top level", f"expected a mapping, got {type(data).__name__}")
    if set(data) - _TOP_KEYS:
        raise _fail(source, "top level", _unknown(set(data), _TOP_KEYS))
    name = data.get("name", "unnamed")
    if not isinstance(name, str) or not name.strip():
        raise _fail(source, "name", f"must be a non-empty string, got {name!r}")
    seed = data.get("seed", 0)
    if not _is_int(seed):
        raise _fail(source, "seed", f"must be an integer, got {seed!r}")
    faults = _parse_faults(data.get("faults"), source)
    workload_defaults = _parse_workload_defaults(data.get("workload_defaults"), source)
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise _fail(source, "nodes", "must be a non-empty list of nodes")
    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_nodes):
        node = _parse_node(raw, i, source)
        if node.name in seen:
            raise _fail(source, f"nodes[{i}] ({node.name!r})", "duplicate node name")
        seen.add(node.name)
        nodes.append(node)
    return ClusterSpec(
        name=name,
        seed=seed,
        nodes=tuple(nodes),
        faults=faults,
        source=source,
        workload_defaults=workload_defaults,
    )


def _parse_node(raw: object, i: int, source: str) -> NodeSpec:
    where = f"nodes[{i}]"
    if not isinstance(raw, dict):
        raise _fail(source, where, f"expected a mapping, got {raw!r}")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip() or ":" in name or "/" in name:
        raise _fail(
            source, f"{where}.name", f"must be a non-empty string without ':' or '/', got {name!r}"
        )
    where = f"node {name!r}"
    if set(raw) - _NODE_KEYS:
        raise _fail(source, where, _unknown(set(raw), _NODE_KEYS))
    region = raw.get("region")
    if not isinstance(region, str) or not region.strip():
        raise _fail(source, f"{where}.region", f"must be a non-empty string, got {region!r}")
    role = raw.get("role", "active")
    if role not in ("active", "spare"):
        raise _fail(source, f"{where}.role", f"must be 'active' or 'spare', got {role!r}")
    ambient = raw.get("ambient_c", DEFAULT_AMBIENT_C)
    if not _is_number(ambient) or not -20.0 <= float(ambient) <= 60.0:
        raise _fail(source, f"{where}.ambient_c", f"must be a number in [-20, 60], got {ambient!r}")
    groups_raw = raw.get("devices")
    if not isinstance(groups_raw, list) or not groups_raw:
        raise _fail(source, f"{where}.devices", "must be a non-empty list of {sku, count}")
    groups: list[DeviceGroup] = []
    for j, g in enumerate(groups_raw):
        gw = f"{where}.devices[{j}]"
        if not isinstance(g, dict):
            raise _fail(source, gw, f"expected a mapping {{sku, count}}, got {g!r}")
        if set(g) - _GROUP_KEYS:
            raise _fail(source, gw, _unknown(set(g), _GROUP_KEYS))
        if "sku" not in g or not isinstance(g["sku"], str):
            raise _fail(source, f"{gw}.sku", f"must be a SKU name, got {g.get('sku')!r}")
        try:
            spec = sku(g["sku"])
        except InvalidRequestError as e:
            raise _fail(source, f"{gw}.sku", str(e)) from None
        count = g.get("count", 1)
        if not _is_int(count) or count < 1:
            raise _fail(source, f"{gw}.count", f"must be an integer >= 1, got {count!r}")
        groups.append(DeviceGroup(sku=spec.name, count=count))
    return NodeSpec(
        name=name, region=region, role=role, devices=tuple(groups), ambient_c=float(ambient)
    )


def _parse_faults(raw: object, source: str) -> FaultSettings:
    if raw is None:
        return FaultSettings()
    if not isinstance(raw, dict):
        raise _fail(source, "faults", f"expected a mapping, got {raw!r}")
    if set(raw) - _FAULT_KEYS:
        raise _fail(source, "faults", _unknown(set(raw), _FAULT_KEYS))
    natural = raw.get("natural", True)
    if not isinstance(natural, bool):
        raise _fail(source, "faults.natural", f"must be true or false, got {natural!r}")
    params: dict[str, Any] = {}
    for key in _FAULT_KEYS - {"natural"}:
        if key not in raw:
            continue
        v = raw[key]
        if key == "gpus_per_node":
            if not _is_int(v) or v < 1:
                raise _fail(source, f"faults.{key}", f"must be an integer >= 1, got {v!r}")
        elif not _is_number(v) or v < 0:
            raise _fail(source, f"faults.{key}", f"must be a number >= 0, got {v!r}")
        params[key] = v
    try:
        hazard = HazardModel(**params)
    except ValueError as e:
        raise _fail(source, "faults", str(e)) from None
    return FaultSettings(natural=natural, hazard=hazard)


def _parse_workload_defaults(raw: object, source: str) -> WorkloadDefaults:
    if raw is None:
        return WorkloadDefaults()
    if not isinstance(raw, dict):
        raise _fail(source, "workload_defaults", f"expected a mapping, got {raw!r}")
    if set(raw) - _WORKLOAD_KEYS:
        raise _fail(source, "workload_defaults", _unknown(set(raw), _WORKLOAD_KEYS))
    m = raw.get("memory_bound_ratio", DEFAULT_MEMORY_BOUND_RATIO)
    if not _is_number(m) or not 0.0 <= m <= 1.0:
        raise _fail(source, "workload_defaults.memory_bound_ratio", f"must be in [0, 1], got {m!r}")
    a = raw.get("activity", DEFAULT_ACTIVITY)
    if not _is_number(a) or not 0.0 < a <= 1.0:
        raise _fail(source, "workload_defaults.activity", f"must be in (0, 1], got {a!r}")
    return WorkloadDefaults(memory_bound_ratio=float(m), activity=float(a))


def load_cluster_spec(path: Path | None = None) -> ClusterSpec:
    """Read and validate a cluster spec; None reads the packaged default fleet."""
    if path is None:
        res = importlib.resources.files("gpuflow.hardware.data").joinpath("default_cluster.yaml")
        text = res.read_text(encoding="utf-8")
        source = "<packaged default>"
    else:
        path = Path(path)
        source = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ClusterSpecError(f"cluster spec {source}: cannot read: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ClusterSpecError(f"cluster spec {source}: not valid YAML: {e}") from None
    return parse_cluster_spec(data, source)
