"""What fleet history to build: the configuration, its constants, and the seeding helpers
every part of the build shares (so the same seed draws the same history).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from typing import Any

from gpuflow.hardware.sim.hazard import DAY_S, HazardModel
from gpuflow.hardware.sim.noise import NoiseModel
from gpuflow.hardware.skus import sku as lookup_sku
from gpuflow.tasks.health.features import BUCKET_S, WINDOW_BUCKETS
from pydantic import BaseModel, ConfigDict, Field, model_validator

SPLITS = ("train", "val", "test")
ABRUPT_LOOKBACK_S = 24 * 3600.0  # incident segment of an abrupt failure: the day before
PRECURSOR_MARGIN_S = 3600.0  # an incident segment starts this long before the onset
# Repair durations: the deciles (min, p10, ..., p90, max; seconds) of the InfiniteHBD trace's
# GPU-class faults, start to end (tasks.health.trace_calibration.repair_deciles_s; a test
# checks they agree). Bimodal: half are back within 3 h (a reset), a tenth take 18+ days.
TRACE_REPAIR_DECILES_S = (
    268.0,
    743.0,
    798.0,
    1173.0,
    10226.0,
    60441.0,
    117243.0,
    212274.0,
    357482.0,
    1550737.0,
    7944558.0,
)
U_STEP = 0.05  # load quantization of the steady-state table
TEMP_NOISE_C = 0.3  # estimate: sensor noise
POWER_NOISE_RATIO = 0.01  # estimate


class HistoryConfig(BaseModel):
    """What fleet, how long, how it is split and sampled. Defaults: the real run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nodes: int = Field(2048, ge=3, description="nodes in the fleet")
    gpus_per_node: int = Field(8, ge=1, le=16)
    days: float = Field(365.0, gt=1.0, le=3650.0)
    seed: int = 20261130
    sku_mix: dict[str, float] = Field(
        default_factory=lambda: {
            "NVIDIA A100-SXM4-40GB": 0.4,
            "NVIDIA A100-SXM4-80GB": 0.1,
            "NVIDIA H100 80GB HBM3": 0.3,
            "Tesla V100-SXM2-32GB": 0.1,
            "Hygon DCU Z100": 0.1,
        },
        description="share of nodes per SKU (a node holds one SKU)",
    )
    ambient_c: float = Field(30.0, description="mean inlet temperature; nodes vary +-2 C")
    rate_per_node_day: float | None = Field(None, ge=0, description="None: the twin's default")
    abrupt_share: float | None = None
    lemon_fraction: float | None = None
    lemon_factor: float | None = None
    hazard_overrides: dict[str, float] = Field(
        default_factory=dict,
        description="any other hardware.sim.hazard.HazardModel field (repeat_factor, "
        "hbm_silent_share, hbm_errors_sigma, ...): its default otherwise",
    )
    noise: dict[str, float] = Field(
        default_factory=dict,
        description="hardware.sim.noise.NoiseModel fields (benign_remap_per_day, "
        "burst_per_day, dropout_per_day, ...): its defaults otherwise",
    )
    repair_deciles_s: tuple[float, ...] = Field(
        TRACE_REPAIR_DECILES_S,
        description="repair time deciles (min..max); drawn log-linearly between them",
    )
    app_xid_per_day: float = Field(0.05, ge=0, description="application XIDs (noise)")
    busy_median_s: float = Field(8 * 3600.0, gt=0)
    idle_median_s: float = Field(3600.0, gt=0)
    node_fractions: tuple[float, float, float] = (0.5, 0.2, 0.3)
    time_fractions: tuple[float, float, float] = (0.5, 0.2, 0.3)
    background_segments: tuple[int, int, int] = (4000, 1500, 3000)
    background_segment_s: tuple[float, float, float] = (2 * 3600.0, 6 * 3600.0, 24 * 3600.0)
    # Noise events (benign remaps, healed degradations) are rare in device-time, so a
    # uniform sample would hardly hold one: these many background segments per split are
    # drawn among them instead (a stratum of its own, weighted by its own share: see
    # history_splits), so the models see precursor-like noise on healthy devices.
    noise_segments: tuple[int, int, int] = (600, 300, 600)
    noise_after_s: float = Field(12 * 3600.0, gt=0, description="noise stratum after an event")
    window: int = Field(WINDOW_BUCKETS, ge=2)
    horizon_s: float = Field(1800.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> HistoryConfig:
        for name in ("node_fractions", "time_fractions"):
            v = getattr(self, name)
            if any(x <= 0 for x in v) or abs(sum(v) - 1.0) > 1e-6:
                raise ValueError(f"{name} must be three positive shares summing to 1, got {v}")
        if not self.sku_mix or any(w < 0 for w in self.sku_mix.values()):
            raise ValueError(f"sku_mix must map SKU names to shares >= 0, got {self.sku_mix}")
        for name in self.sku_mix:
            try:
                lookup_sku(name)
            except (KeyError, ValueError) as exc:
                raise ValueError(f"sku_mix: unknown SKU {name!r}") from exc
        if any(n < 1 for n in self.background_segments):
            raise ValueError("background_segments must be >= 1 per split")
        if any(s < BUCKET_S for s in self.background_segment_s):
            raise ValueError(f"background_segment_s must be >= {BUCKET_S} s")
        for i, split in enumerate(SPLITS):
            if self.days * self.time_fractions[i] * DAY_S < self.background_segment_s[i]:
                raise ValueError(f"the {split} time range is shorter than its background segment")
        if round(self.nodes * self.node_fractions[0]) < 1:
            raise ValueError("too few nodes for the train split")
        if any(n < 0 for n in self.noise_segments):
            raise ValueError("noise_segments must be >= 0 per split")
        d = self.repair_deciles_s
        if len(d) < 2 or d[0] <= 0 or any(b < a for a, b in zip(d, d[1:], strict=False)):
            raise ValueError("repair_deciles_s must be >= 2 increasing positive durations")
        try:
            self.hazard()
            self.noise_model()
        except TypeError as exc:  # an unknown field name
            raise ValueError(str(exc)) from exc
        return self

    def hazard(self) -> HazardModel:
        kw: dict[str, Any] = {**self.hazard_overrides, "gpus_per_node": self.gpus_per_node}
        for name in ("rate_per_node_day", "abrupt_share", "lemon_fraction", "lemon_factor"):
            v = getattr(self, name)
            if v is not None:
                kw[name] = v
        return HazardModel(**kw)

    def noise_model(self) -> NoiseModel:
        return NoiseModel(**self.noise)

    def cache_key(self) -> str:
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256((HISTORY_VERSION + text).encode()).hexdigest()[:16]

    @classmethod
    def small(cls, **overrides: Any) -> HistoryConfig:
        """A small fleet for tests and quick runs: 96 nodes, 120 days, a raised hazard."""
        base: dict[str, Any] = {
            "nodes": 96,
            "days": 120.0,
            "rate_per_node_day": 0.06,
            "background_segments": (300, 150, 300),
            "background_segment_s": (2 * 3600.0, 4 * 3600.0, 12 * 3600.0),
            "noise_segments": (120, 60, 120),
        }
        base.update(overrides)
        return cls(**base)


HISTORY_VERSION = "3"  # part of the cache key and of the saved file: bump on any change of output


def history_rng(*parts: object) -> random.Random:
    """A random stream of its own per purpose (seed, what, which), so that drawing one part
    of the history never shifts the draws of another."""
    return random.Random(":".join(str(p) for p in ("gpuflow-history", *parts)))


def align_down(t: float) -> float:
    """``t`` rounded down to a bucket boundary."""
    return math.floor(t / BUCKET_S) * BUCKET_S
