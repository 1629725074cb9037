"""The health model: an LSTM over a window of buckets -> P(failure within 1 h, 6 h, 24 h, 72 h).

Each bucket carries the device's multi-day record (tasks.health.device_state) besides its
hour of telemetry, so the LSTM sees repeat offenders and old remaps, not just the last hour.
Its head is a discrete-time hazard (tasks.health.horizons): one hazard per interval
[0, 1 h), [1 h, 6 h), [6 h, 24 h), [24 h, 72 h), P(T <= H_j) = 1 - prod (1 - h_i), so the
horizons are one consistent model, trained with the survival likelihood (a window whose
failure is further than 72 h, or never, is censored there).

Training sees far more healthy windows than failing ones, so it trains on a sample
(every window within ``near_negatives_s`` of a failure, some of each incident's earlier
ones, random background windows) with failing windows up-weighted, and is then
calibrated on a split of its own (tasks.health.calibration), each window carrying its
population weight: the risks it reports are probabilities for the real fleet's base
rates, which is what the cost rule (tasks.health.decision) compares.

``HealthLSTM`` carries its own normalization, calibration and metadata (features, window,
bucket length, horizons, the horizon its single risk is for), so the registered model is
everything the monitor needs.

Missing inputs (NaN: telemetry the device's backend cannot read, see tasks.health.features)
go in as 0 after normalization plus one 0/1 "unreadable" channel per input group, so the
LSTM learns what a DCU without ECC or XIDs looks like instead of reading "no errors" there.
"""

from __future__ import annotations

import math
import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from gpuflow.tasks.health.calibration import HorizonCalibrator
from gpuflow.tasks.health.features import BUCKET_S, FEATURE_INPUTS, FEATURES, WINDOW_BUCKETS
from gpuflow.tasks.health.history import History, SplitData
from gpuflow.tasks.health.horizons import (
    HORIZONS_S,
    check_horizons,
    interval_index,
    multi_labels,
)
from gpuflow.tasks.health.registry import CHAMPION_ALIAS as CHAMPION_ALIAS
from gpuflow.tasks.health.registry import HEALTH_MODEL_ARTIFACT
from gpuflow.tasks.health.registry import REGISTERED_MODEL as REGISTERED_MODEL
from gpuflow.tasks.health.registry import champion_uri as champion_uri
from gpuflow.tasks.health.registry import load_champion as load_champion
from gpuflow.tasks.health.registry import load_registered as load_registered
from sklearn.metrics import average_precision_score
from torch import nn
from torch.nn import functional as F

EXPERIMENT = "gpuflow-health"


class HealthModel(Protocol):
    """What the monitor and the evaluation need of a model: ``predict_risk`` is the risk
    at ``horizon_s``; multi-horizon models also have ``horizons_s`` and ``predict_risks``."""

    window: int
    feature_names: tuple[str, ...]

    def predict_risk(self, windows: np.ndarray) -> np.ndarray: ...


class MultiHorizon:
    """The single-risk view of a multi-horizon model: ``predict_risk`` is the column of
    ``horizon_s`` (the horizon the champion was chosen at) of ``predict_risks``."""

    horizons_s: tuple[float, ...]
    horizon_s: float

    def predict_risks(self, windows: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def horizon_index(self, horizon_s: float | None = None) -> int:
        h = self.horizon_s if horizon_s is None else float(horizon_s)
        if h not in self.horizons_s:
            raise ValueError(f"horizon {h} s is not one of the model's {list(self.horizons_s)}")
        return self.horizons_s.index(h)

    def use_horizon(self, horizon_s: float) -> None:
        self.horizon_index(horizon_s)  # checks it
        self.horizon_s = float(horizon_s)

    def predict_risk(self, windows: np.ndarray) -> np.ndarray:
        return self.predict_risks(windows)[:, self.horizon_index()]


class HealthLSTM(MultiHorizon, nn.Module):
    """LSTM -> last hidden state (+ the newest bucket) -> per-interval hazard logits."""

    name = "lstm"

    def __init__(
        self,
        hidden: int = 32,
        layers: int = 1,
        window: int = WINDOW_BUCKETS,
        bucket_s: float = BUCKET_S,
        horizons_s: tuple[float, ...] = HORIZONS_S,
        feature_names: tuple[str, ...] = FEATURES,
    ) -> None:
        nn.Module.__init__(self)
        n = len(feature_names)
        self.window = int(window)
        self.bucket_s = float(bucket_s)
        self.horizons_s = check_horizons(horizons_s)
        self.horizon_s = self.horizons_s[0]
        self.feature_names = tuple(feature_names)
        self.hidden = int(hidden)
        self.register_buffer("mean", torch.zeros(n))
        self.register_buffer("std", torch.ones(n))
        self.calibrator = HorizonCalibrator()  # fitted on the calibration split
        self.mask_idx = mask_columns(self.feature_names)
        n_in = n + len(self.mask_idx)
        self.lstm = nn.LSTM(n_in, hidden, num_layers=layers, batch_first=True)
        # The head also sees the newest bucket as it is (its counters, flags and the
        # device's record), so they need not squeeze through the LSTM's gates.
        self.head = nn.Sequential(
            nn.Linear(hidden + n_in, hidden), nn.ReLU(), nn.Linear(hidden, len(self.horizons_s))
        )

    def hazard_logits(self, x: torch.Tensor) -> torch.Tensor:
        """[n, H] logits of the per-interval hazards."""
        z = torch.nan_to_num((x - self.mean) / self.std, nan=0.0)
        if self.mask_idx:
            z = torch.cat([z, torch.isnan(x[..., self.mask_idx]).to(z.dtype)], dim=-1)
        out, _ = self.lstm(z)
        return self.head(torch.cat([out[:, -1], z[:, -1]], dim=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Uncalibrated P(T <= H_j) [n, H]: 1 - prod (1 - hazard)."""
        log_survive = torch.cumsum(F.logsigmoid(-self.hazard_logits(x)), dim=1)
        return -torch.expm1(log_survive)

    def _check(self, windows: np.ndarray) -> None:
        if windows.ndim != 3 or windows.shape[1:] != (self.window, len(self.feature_names)):
            raise ValueError(
                f"windows must be [n, {self.window}, {len(self.feature_names)}], "
                f"got {list(windows.shape)}"
            )

    @torch.no_grad()
    def raw_risks(self, windows: np.ndarray, batch: int = 65_536) -> np.ndarray:
        """Uncalibrated cumulative risks [n, H] (float64)."""
        self._check(windows)
        self.eval()
        out = np.empty((len(windows), len(self.horizons_s)), dtype=np.float64)
        for i in range(0, len(windows), batch):
            x = torch.from_numpy(np.ascontiguousarray(windows[i : i + batch], dtype=np.float32))
            out[i : i + batch] = self(x).double().numpy()
        return out

    def predict_risks(self, windows: np.ndarray) -> np.ndarray:
        """Calibrated P(fail within each horizon) [n, H], float32, monotone in H."""
        return self.calibrator(self.raw_risks(windows))

    def top_features(self, windows: np.ndarray, k: int = 3) -> list[dict[str, float]]:
        """Per window, the ``k`` features whose removal lowers the risk most (occlusion:
        the feature replaced by its training mean over the whole window), with their value
        in the newest bucket. For the few devices above the threshold, not the fleet."""
        self._check(windows)
        return occlusion_top_features(
            self.predict_risk, windows, self.mean.numpy(), self.feature_names, k
        )


def occlusion_top_features(
    predict_risk: Callable[[np.ndarray], np.ndarray],
    windows: np.ndarray,
    fill: np.ndarray,
    names: Sequence[str],
    k: int = 3,
) -> list[dict[str, float]]:
    """Per window [n, W, F], the ``k`` features whose occlusion (feature j replaced by
    ``fill[j]`` over the whole window) lowers ``predict_risk`` most, each with its value in
    the newest bucket. Any model that scores windows can be explained this way."""
    if not len(windows):
        return []
    base = predict_risk(windows)
    n, _, f = windows.shape
    occluded = np.repeat(windows[None], f, axis=0).copy()  # [F, n, W, F]
    for j in range(f):
        occluded[j, :, :, j] = fill[j]
    drops = base[None, :] - predict_risk(occluded.reshape(f * n, *windows.shape[1:])).reshape(f, n)
    # A missing feature did not drive the score: it has no value to name.
    drops[np.isnan(windows[:, -1, :]).T] = -np.inf
    out = []
    for i in range(n):
        order = [j for j in np.argsort(-drops[:, i]) if np.isfinite(drops[j, i])][:k]
        out.append({names[j]: round(float(windows[i, -1, j]), 4) for j in order})
    return out


@dataclass(frozen=True)
class TrainConfig:
    hidden: int = 32
    layers: int = 1
    epochs: int = 8
    batch_size: int = 512
    lr: float = 3e-3
    weight_decay: float = 1e-4
    near_negatives_s: float = 6 * 3600.0  # incident windows this close to failure: all kept
    far_negatives_per_incident: int = 48  # and this many from further back
    max_background: int = 60_000
    pos_weight_max: float = 50.0
    patience: int = 3
    seed: int = 0
    threads: int | None = 1  # one thread: faster than two on a busy 2-core machine

    def __post_init__(self) -> None:
        for name in ("hidden", "layers", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"TrainConfig.lr must be > 0, got {self.lr}")

    @classmethod
    def small(cls, **overrides: Any) -> TrainConfig:
        base: dict[str, Any] = {
            "hidden": 16,
            "epochs": 3,
            "max_background": 5_000,
            "far_negatives_per_incident": 16,
        }
        base.update(overrides)
        return cls(**base)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def training_indices(
    split: SplitData, cfg: TrainConfig, horizons_s: tuple[float, ...] = HORIZONS_S
) -> tuple[np.ndarray, np.ndarray]:
    """(window indices, labels [n, H]) of the training sample of ``split``: every incident
    window within ``near_negatives_s`` of its failure, ``far_negatives_per_incident`` of
    each incident's earlier ones, up to ``max_background`` background windows (whose
    device may still fail within the longer horizons: their labels say so)."""
    rng = np.random.default_rng(cfg.seed)
    is_bg = split.seg_kind[split.seg] == 1
    inc = np.flatnonzero(~is_bg)
    near = inc[split.ttf_s[inc] <= cfg.near_negatives_s]
    far = inc[split.ttf_s[inc] > cfg.near_negatives_s]
    n_inc = max(1, len(np.unique(split.seg[inc])) if len(inc) else 1)
    n_far = min(len(far), cfg.far_negatives_per_incident * n_inc)
    far = rng.choice(far, n_far, replace=False) if n_far else far[:0]
    bg = np.flatnonzero(is_bg)
    if len(bg) > cfg.max_background:
        bg = rng.choice(bg, cfg.max_background, replace=False)
    idx = np.concatenate([near, far, bg])
    rng.shuffle(idx)
    return idx, multi_labels(split.ttf_s[idx], horizons_s)


def positive_weight(y: np.ndarray, cfg: TrainConfig) -> float:
    """Up-weighting of windows that fail within the last horizon (capped)."""
    pos = float((y[:, -1] > 0).sum())
    if pos == 0:
        raise ValueError(
            "the train split holds no positive window: a longer history or a larger fleet is needed"
        )
    return min((len(y) - pos) / pos, cfg.pos_weight_max)


def hazard_nll(logits: torch.Tensor, interval: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Weighted negative log-likelihood of discrete-time survival: survive every interval
    before the failure's, fail in its own (none when censored: ``interval`` = H)."""
    h = logits.shape[1]
    steps = torch.arange(h).unsqueeze(0)
    survive = (steps < interval.unsqueeze(1)).to(logits.dtype)
    fail = (steps == interval.unsqueeze(1)).to(logits.dtype)
    ll = survive * F.logsigmoid(-logits) + fail * F.logsigmoid(logits)
    return -(ll.sum(dim=1) * weight).sum() / weight.sum()


def weighted_ap(y: np.ndarray, score: np.ndarray, weight: np.ndarray) -> float:
    """PR-AUC (average precision) with population weights; nan without positives."""
    if y.sum() == 0:
        return float("nan")
    return float(average_precision_score(y, score, sample_weight=weight))


def mean_ap(y: np.ndarray, scores: np.ndarray, weight: np.ndarray) -> float:
    """Mean over horizons of the weighted PR-AUC (horizons without positives left out)."""
    aps = [weighted_ap(y[:, j], scores[:, j], weight) for j in range(y.shape[1])]
    aps = [a for a in aps if not math.isnan(a)]
    return float(np.mean(aps)) if aps else -math.inf


def mask_columns(feature_names: tuple[str, ...]) -> list[int]:
    """One column per distinct group of optional inputs (all XID features go missing
    together): where it is NaN, the model gets an "unreadable" flag."""
    seen: set[frozenset[str]] = set()
    out = []
    for i, name in enumerate(feature_names):
        inputs = FEATURE_INPUTS.get(name)
        if inputs is not None and inputs not in seen:
            seen.add(inputs)
            out.append(i)
    return out


def feature_stats(windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and std over the readable values (NaN = missing is left out; a
    feature no device could read normalizes to 0)."""
    flat = windows.reshape(-1, windows.shape[-1]).astype(np.float64)
    seen = ~np.isnan(flat)
    count = seen.sum(axis=0)
    filled = np.where(seen, flat, 0.0)
    mean = filled.sum(axis=0) / np.maximum(count, 1)
    var = (np.where(seen, flat - mean, 0.0) ** 2).sum(axis=0) / np.maximum(count, 1)
    std = np.sqrt(var)
    return mean.astype(np.float32), np.where(std < 1e-6, 1.0, std).astype(np.float32)


def train_lstm(
    history: History,
    cfg: TrainConfig | None = None,
    progress: Callable[[str, float], None] | None = None,
    val: SplitData | None = None,
    cal: SplitData | None = None,
    horizons_s: tuple[float, ...] = HORIZONS_S,
) -> tuple[HealthLSTM, dict[str, Any]]:
    """Train on the train split, early-stop on ``val`` and calibrate on ``cal`` (both the
    val split when not given)."""
    cfg = cfg or TrainConfig()
    say = progress or (lambda _m, _f: None)
    val = val if val is not None else history.splits["val"]
    cal = cal if cal is not None else val
    torch.manual_seed(cfg.seed)
    threads_before = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        train = history.splits["train"]
        idx, y = training_indices(train, cfg, horizons_s)
        pos_weight = positive_weight(y, cfg)
        x = train.windows(idx)
        model = HealthLSTM(cfg.hidden, cfg.layers, history.config.window, BUCKET_S, horizons_s)
        mean, std = feature_stats(x)
        model.mean.copy_(torch.from_numpy(mean))
        model.std.copy_(torch.from_numpy(std))
        xt = torch.from_numpy(np.ascontiguousarray(x))
        it = torch.from_numpy(interval_index(train.ttf_s[idx], horizons_s))
        wt = torch.from_numpy(np.where(y[:, -1] > 0, pos_weight, 1.0).astype(np.float32))
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        val_x = val.windows()
        val_y = multi_labels(val.ttf_s, horizons_s)
        best_ap, best_state, bad, history_ap = -math.inf, None, 0, []
        started = time.perf_counter()
        g = torch.Generator().manual_seed(cfg.seed)
        for epoch in range(cfg.epochs):
            model.train()
            perm = torch.randperm(len(xt), generator=g)
            total = 0.0
            for i in range(0, len(perm), cfg.batch_size):
                b = perm[i : i + cfg.batch_size]
                opt.zero_grad()
                loss = hazard_nll(model.hazard_logits(xt[b]), it[b], wt[b])
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                total += float(loss.detach()) * len(b)
            ap = mean_ap(val_y, model.raw_risks(val_x), val.weight)
            history_ap.append(ap)
            say(
                f"epoch {epoch + 1}/{cfg.epochs}: loss {total / len(xt):.4f}, "
                f"val PR-AUC (mean over horizons) {ap:.4f}",
                (epoch + 1) / cfg.epochs,
            )
            if ap > best_ap:
                best_ap, bad = ap, 0
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            else:
                bad += 1
                if bad >= cfg.patience:
                    break
        if best_state is not None:
            model.load_state_dict(best_state)
        model.calibrator.fit(
            model.raw_risks(cal.windows()), multi_labels(cal.ttf_s, horizons_s), cal.weight
        )
        model.eval()
        info = {
            "train_windows": len(y),
            "train_positives_by_horizon": y.sum(axis=0).astype(int).tolist(),
            "pos_weight": pos_weight,
            "epochs_run": len(history_ap),
            "val_pr_auc_by_epoch": history_ap,
            "val_pr_auc": best_ap,
            "calibration": model.calibrator.describe(),
            "train_s": time.perf_counter() - started,
            "parameters": sum(p.numel() for p in model.parameters()),
        }
        return model, info
    finally:
        torch.set_num_threads(threads_before)


# -- the registry (its readers, light to import: tasks.health.registry) -------------------


# The pyfunc wrapper is logged as code (pyfunc_model.py); its path, not the module, so
# that reading it here does not run its set_model.
HEALTH_PYFUNC_CODE = Path(__file__).with_name("pyfunc_model.py")


def save_health_model(model: Any, folder: Path) -> dict[str, str]:
    """Pickle ``model`` into ``folder``: the ``artifacts`` for log_model beside
    HEALTH_PYFUNC_CODE."""
    path = Path(folder) / f"{HEALTH_MODEL_ARTIFACT}.pkl"
    with path.open("wb") as out:
        pickle.dump(model, out, protocol=pickle.HIGHEST_PROTOCOL)
    return {HEALTH_MODEL_ARTIFACT: str(path)}


__all__ = [
    "CHAMPION_ALIAS",
    "EXPERIMENT",
    "REGISTERED_MODEL",
    "HealthLSTM",
    "HealthModel",
    "MultiHorizon",
    "TrainConfig",
    "champion_uri",
    "HEALTH_PYFUNC_CODE",
    "save_health_model",
    "load_champion",
    "load_registered",
    "train_lstm",
    "training_indices",
    "weighted_ap",
]
