"""The fleet a history covers: its devices (SKU, ambient, lemon, hazard rate, the hazard
model's own draws) and the failures each one will have.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuflow.hardware.sim import faults as F
from gpuflow.hardware.sim.hazard import HealDraw, pick_lemons
from gpuflow.hardware.sim.noise import BenignRemap
from gpuflow.hardware.skus import sku as lookup_sku
from gpuflow.tasks.health.history_config import (
    ABRUPT_LOOKBACK_S,
    PRECURSOR_MARGIN_S,
    HistoryConfig,
    history_rng,
)


@dataclass
class Fault:
    """One failure of one device, as the history sees it."""

    ordinal: int
    kind: str
    onset_s: float
    failure_s: float
    lead_s: float
    final_xid: int
    repaired_s: float
    k: int
    shape: dict[str, float] = field(default_factory=dict)  # HBM: errors_at_failure, stall

    @property
    def abrupt(self) -> bool:
        """No precursor: an abrupt class or a silent HBM failure (lead 0)."""
        return self.kind in ("xid79", "ecc-uncorrectable") or self.lead_s <= 0

    def fault_dict(self) -> dict[str, Any] | None:
        """The twin's fault record (hardware.sim.faults) of a failure with a precursor."""
        if self.abrupt:
            return None
        fault = F.new_fault(self.kind, "natural", self.onset_s, self.lead_s, self.final_xid)
        fault.update(self.shape)
        return fault

    def incident_start_s(self) -> float:
        if self.abrupt:
            return self.failure_s - ABRUPT_LOOKBACK_S
        return min(self.onset_s - PRECURSOR_MARGIN_S, self.failure_s - ABRUPT_LOOKBACK_S)


@dataclass
class Device:
    ordinal: int
    node: str
    node_idx: int
    index: int
    sku: str
    ambient_c: float
    lemon: bool
    rate_per_day: float
    faults: list[Fault] = field(default_factory=list)
    # Noise (tasks.health.history_noise.draw_noise): not failures, but look like precursors.
    remaps: list[BenignRemap] = field(default_factory=list)
    heals: list[HealDraw] = field(default_factory=list)
    burst_t: list[float] = field(default_factory=list)
    burst_n: list[int] = field(default_factory=list)
    dropouts: list[tuple[float, float]] = field(default_factory=list)

    def repaired_before(self, t: float) -> float:
        """The last repair at or before ``t`` (0: the epoch): the counters' base."""
        base = 0.0
        for f in self.faults:
            if f.repaired_s <= t:
                base = f.repaired_s
        return base

    def blocked(self) -> list[tuple[float, float]]:
        """Time ranges that are not background: incidents through repairs."""
        return [(f.incident_start_s(), f.repaired_s) for f in self.faults]


def build_fleet(cfg: HistoryConfig) -> list[Device]:
    """Devices with SKUs, ambients, lemons, rates (the hazard model's own draws)."""
    model = cfg.hazard()
    n = cfg.nodes * cfg.gpus_per_node
    lemons = pick_lemons(cfg.seed, n, model)
    rates = model.device_rates_per_day(n, lemons)
    rng = history_rng(cfg.seed, "fleet")
    names, weights = list(cfg.sku_mix), list(cfg.sku_mix.values())
    devices: list[Device] = []
    for node_idx in range(cfg.nodes):
        sku_name = lookup_sku(rng.choices(names, weights=weights)[0]).name
        ambient = round(cfg.ambient_c + rng.uniform(-2.0, 2.0), 1)
        for index in range(cfg.gpus_per_node):
            o = node_idx * cfg.gpus_per_node + index
            devices.append(
                Device(
                    o, f"n{node_idx:05d}", node_idx, index, sku_name, ambient, o in lemons, rates[o]
                )
            )
    return devices
