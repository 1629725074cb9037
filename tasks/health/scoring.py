"""Scoring a whole fleet at once: samples -> windows -> risks, vectorized.

The window state of every device lives in one FleetWindows (numpy arrays), the model
scores all windows in one batch, and only the few devices above the threshold get the
slower per-feature explanation. Devices that are gone score 1.0 without a model ("device
lost"), as do devices that have failed while still answering (see failure_reason).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from gpuflow.hardware.backend import Backend, TelemetrySample
from gpuflow.tasks.health.events import DEFAULT_HORIZON_S, DEVICE_LOST_REASON, DeviceRisk
from gpuflow.tasks.health.features import FEATURES, missing_in
from gpuflow.tasks.health.fleet_windows import FleetWindows
from gpuflow.tasks.health.sampler import FleetSample, TelemetrySampler

if TYPE_CHECKING:
    # A type only: importing the module would load torch and sklearn (seconds).
    from gpuflow.tasks.health.model import HealthModel

# XIDs that are the failure itself, not a warning of it (hardware.sim.faults ends HBM
# degradations with these; XID 48 is a double-bit error).
FAILURE_XIDS = frozenset({48, 64, 94, 95})
DEVICE_FAILED_REASON = "device failed"


def failure_reason(s: TelemetrySample) -> str | None:
    """Why a present device has already failed, or None. A failure XID in this sample, an
    uncorrectable ECC error since the last reset (the counters are volatile: a reset
    clears them) or a failed row remap: the device needs a reset, its jobs are gone. It
    stays so until repaired, so its incident stays open (one event). A signal the
    backend cannot read (None) tells nothing: such a device fails without this warning."""
    failed = sorted(set(s.xids or ()) & FAILURE_XIDS)
    if failed:
        return f"{DEVICE_FAILED_REASON} (XID {'/'.join(map(str, failed))})"
    if s.ecc_uncorrected_total is not None and s.ecc_uncorrected_total > 0:
        return f"{DEVICE_FAILED_REASON} (uncorrectable ECC errors since reset)"
    if s.remapped_rows_failure:
        return f"{DEVICE_FAILED_REASON} (row remapping failed)"
    return None


def explain(model: Any, windows: np.ndarray, k: int = 3) -> list[dict[str, float]]:
    """Top features per window when the model can say (HealthLSTM, rules), else {}."""
    fn = getattr(model, "top_features", None)
    if fn is None or not len(windows):
        return [{} for _ in range(len(windows))]
    return fn(windows, k)


class FleetScorer:
    """Keeps the fleet's windows and scores every device from each new round of samples."""

    def __init__(
        self,
        model: HealthModel,
        windows: FleetWindows | None = None,
        explain_above: float = 0.5,
    ) -> None:
        self.model = model
        self.windows = windows if windows is not None else FleetWindows(window=model.window)
        if self.windows.window != model.window:
            raise ValueError(
                f"window state holds {self.windows.window} buckets, the model reads {model.window}"
            )
        if tuple(model.feature_names) != FEATURES:
            raise ValueError("the model was trained on other features than this code computes")
        self.explain_above = explain_above
        # What the risks are a probability of: failure within this horizon (the rules
        # were judged against the same labels as the LSTM).
        self.horizon_s = float(getattr(model, "horizon_s", DEFAULT_HORIZON_S))

    def score_round(self, fleet: FleetSample, max_clock_mhz: Sequence[float]) -> list[DeviceRisk]:
        """Update the windows with one round and score every device of it."""
        return self.score_rows(fleet, self.windows.update(fleet.samples, max_clock_mhz))

    def score_rows(self, fleet: FleetSample, rows: np.ndarray) -> list[DeviceRisk]:
        """Score a round whose samples are already in the windows (at ``rows``): how a
        second model (the challenger in shadow) reads the windows the first one updated."""
        out: list[DeviceRisk] = []
        if fleet.samples:
            win = self.windows.windows(rows)
            risk = self.model.predict_risk(win)
            hot = np.flatnonzero(risk >= self.explain_above)
            reasons = dict(zip(hot.tolist(), explain(self.model, win[hot]), strict=True))
            missing = missing_in(win)
            for i, s in enumerate(fleet.samples):
                dev = fleet.devices.get((s.node, s.index))
                sku = dev.sku if dev else ""
                why = failure_reason(s)
                if why is not None:
                    evidence = {
                        k: float(v)
                        for k, v in (
                            ("ecc_uncorrected_total", s.ecc_uncorrected_total),
                            ("remap_failure", s.remapped_rows_failure),
                        )
                        if v is not None
                    }
                    out.append(
                        DeviceRisk(
                            s.node, s.index, sku, 1.0, evidence, why, missing[i], self.horizon_s
                        )
                    )
                    continue
                out.append(
                    DeviceRisk(
                        s.node,
                        s.index,
                        sku,
                        float(risk[i]),
                        reasons.get(i, {}),
                        "model",
                        missing[i],
                        self.horizon_s,
                    )
                )
        for lost in fleet.lost:
            d = lost.device
            out.append(
                DeviceRisk(
                    d.node,
                    d.index,
                    d.sku,
                    1.0,
                    {"present": 0.0},
                    DEVICE_LOST_REASON,
                    horizon_s=self.horizon_s,
                )
            )
        return out


def max_clocks(sampler: TelemetrySampler, fleet: FleetSample) -> list[float]:
    return [
        sampler.max_clock_mhz(fleet.devices[(s.node, s.index)])
        if (s.node, s.index) in fleet.devices
        else 0.0
        for s in fleet.samples
    ]


def score_fleet(
    backend: Backend,
    model: HealthModel | None = None,
    scorer: FleetScorer | None = None,
    sampler: TelemetrySampler | None = None,
) -> list[DeviceRisk]:
    """One sample of every device, scored. Without a ``scorer`` the windows start empty
    (a device's single sample stands for its whole window): pass the monitor's scorer to
    continue its state. Without a ``model``: the registered champion."""
    if scorer is None:
        if model is None:
            from gpuflow.tasks.health.registry import load_champion

            model = load_champion()
        scorer = FleetScorer(model)
    sampler = sampler or TelemetrySampler(backend)
    fleet = sampler.sample_all()
    return scorer.score_round(fleet, max_clocks(sampler, fleet))
