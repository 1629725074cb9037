"""The health model: an LSTM over a window of buckets -> P(failure within the horizon).

Training sees far more healthy windows than failing ones (a failure is 6 windows of 30
minutes; a device-year is 105,000), so it trains on a sample (every positive window, the
negatives of incidents near their failure, random healthy windows) with the positives
up-weighted, and is then calibrated: a logistic fit of its logit on the validation split,
where each window carries its population weight. The risk it reports is therefore a
probability for the real fleet's base rate, which is what the monitor's threshold (0.85)
is compared with.

``HealthLSTM`` carries its own normalization, calibration and metadata (features, window,
bucket length, horizon), so the registered MLflow model is everything the monitor needs.

Missing inputs (NaN: telemetry the device's backend cannot read, see tasks.health.features)
go in as 0 after normalization plus one 0/1 "unreadable" channel per input group, so the
LSTM learns what a DCU without ECC or XIDs looks like instead of reading "no errors" there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
import torch
from gpuflow.tasks.health.events import DEFAULT_HORIZON_S
from gpuflow.tasks.health.features import BUCKET_S, FEATURE_INPUTS, FEATURES, WINDOW_BUCKETS
from gpuflow.tasks.health.history import History, SplitData
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score
from torch import nn

REGISTERED_MODEL = "gpuflow-health-lstm"
CHAMPION_ALIAS = "champion"
EXPERIMENT = "gpuflow-health"


class HealthModel(Protocol):
    """What the monitor and the evaluation need of a model."""

    window: int
    feature_names: tuple[str, ...]

    def predict_risk(self, windows: np.ndarray) -> np.ndarray: ...


class HealthLSTM(nn.Module):
    """LSTM -> last hidden state -> linear -> logit; calibrated sigmoid -> risk."""

    def __init__(
        self,
        hidden: int = 32,
        layers: int = 1,
        window: int = WINDOW_BUCKETS,
        bucket_s: float = BUCKET_S,
        horizon_s: float = DEFAULT_HORIZON_S,
        feature_names: tuple[str, ...] = FEATURES,
    ) -> None:
        super().__init__()
        n = len(feature_names)
        self.window = int(window)
        self.bucket_s = float(bucket_s)
        self.horizon_s = float(horizon_s)
        self.feature_names = tuple(feature_names)
        self.hidden = int(hidden)
        self.register_buffer("mean", torch.zeros(n))
        self.register_buffer("std", torch.ones(n))
        self.register_buffer("calibration", torch.tensor([1.0, 0.0]))  # risk = sig(a*z + b)
        self.mask_idx = mask_columns(self.feature_names)
        n_in = n + len(self.mask_idx)
        self.lstm = nn.LSTM(n_in, hidden, num_layers=layers, batch_first=True)
        # The head also sees the newest bucket as it is: counters and flags that matter at
        # their exact level need not squeeze through the LSTM's gates.
        # Error-counter totals also go in on a linear scale (hundreds): whether 390 or 399
        # errors have accumulated is lost in a standardized logarithm.
        self.linear_idx = [i for i, f in enumerate(feature_names) if f.endswith("_total_log")]
        self.head = nn.Sequential(
            nn.Linear(hidden + n_in + len(self.linear_idx), hidden),
            nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        # Models saved before missing inputs existed have no mask_idx: they read no mask.
        mask_idx = getattr(self, "mask_idx", [])
        z = torch.nan_to_num((x - self.mean) / self.std, nan=0.0)
        if mask_idx:
            z = torch.cat([z, torch.isnan(x[..., mask_idx]).to(z.dtype)], dim=-1)
        out, _ = self.lstm(z)
        lin = torch.nan_to_num(torch.expm1(x[:, -1, self.linear_idx]), nan=0.0) / 100.0
        return self.head(torch.cat([out[:, -1], z[:, -1], lin], dim=1)).squeeze(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.calibration[0], self.calibration[1]
        return torch.sigmoid(a * self.logits(x) + b)

    def _check(self, windows: np.ndarray) -> None:
        if windows.ndim != 3 or windows.shape[1:] != (self.window, len(self.feature_names)):
            raise ValueError(
                f"windows must be [n, {self.window}, {len(self.feature_names)}], "
                f"got {list(windows.shape)}"
            )

    @torch.no_grad()
    def raw_logits(self, windows: np.ndarray, batch: int = 65_536) -> np.ndarray:
        self._check(windows)
        self.eval()
        out = np.empty(len(windows), dtype=np.float32)
        for i in range(0, len(windows), batch):
            x = torch.from_numpy(np.ascontiguousarray(windows[i : i + batch], dtype=np.float32))
            out[i : i + batch] = self.logits(x).numpy()
        return out

    def predict_risk(self, windows: np.ndarray, batch: int = 65_536) -> np.ndarray:
        """Calibrated risk per window, float32 in [0, 1]."""
        z = self.raw_logits(windows, batch)
        a, b = (float(v) for v in self.calibration)
        return (1.0 / (1.0 + np.exp(-(a * z + b)))).astype(np.float32)

    def top_features(self, windows: np.ndarray, k: int = 3) -> list[dict[str, float]]:
        """Per window, the ``k`` features whose removal lowers the risk most (occlusion:
        the feature replaced by its training mean over the whole window), with their value
        in the newest bucket. For the few devices above the threshold, not the fleet."""
        self._check(windows)
        if not len(windows):
            return []
        base = self.predict_risk(windows)
        n, _, f = windows.shape
        occluded = np.repeat(windows[None], f, axis=0).copy()  # [F, n, W, F]
        mean = self.mean.numpy()
        for j in range(f):
            occluded[j, :, :, j] = mean[j]
        drops = base[None, :] - self.predict_risk(
            occluded.reshape(f * n, *windows.shape[1:])
        ).reshape(f, n)
        # A missing feature did not drive the score: it has no value to name.
        drops[np.isnan(windows[:, -1, :]).T] = -np.inf
        out = []
        for i in range(n):
            order = [j for j in np.argsort(-drops[:, i]) if np.isfinite(drops[j, i])][:k]
            out.append({self.feature_names[j]: round(float(windows[i, -1, j]), 4) for j in order})
        return out


@dataclass(frozen=True)
class TrainConfig:
    hidden: int = 32
    layers: int = 1
    epochs: int = 8
    batch_size: int = 512
    lr: float = 3e-3
    weight_decay: float = 1e-4
    near_negatives_s: float = 6 * 3600.0  # incident negatives this close to failure: all kept
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
    split: SplitData, horizon_s: float, cfg: TrainConfig
) -> tuple[np.ndarray, np.ndarray]:
    """(window indices, labels) of the training sample of ``split``."""
    rng = np.random.default_rng(cfg.seed)
    y = split.labels(horizon_s)
    is_bg = split.seg_kind[split.seg] == 1
    pos = np.flatnonzero(y == 1)
    inc_neg = np.flatnonzero((y == 0) & ~is_bg)
    near = inc_neg[split.ttf_s[inc_neg] <= cfg.near_negatives_s]
    far = inc_neg[split.ttf_s[inc_neg] > cfg.near_negatives_s]
    n_inc = max(1, len(np.unique(split.seg[inc_neg])) if len(inc_neg) else 1)
    n_far = min(len(far), cfg.far_negatives_per_incident * n_inc)
    far = rng.choice(far, n_far, replace=False) if n_far else far[:0]
    bg = np.flatnonzero(is_bg)
    if len(bg) > cfg.max_background:
        bg = rng.choice(bg, cfg.max_background, replace=False)
    idx = np.concatenate([pos, near, far, bg])
    rng.shuffle(idx)
    return idx, y[idx]


def fit_calibration(logits: np.ndarray, y: np.ndarray, weight: np.ndarray) -> tuple[float, float]:
    """(a, b) of risk = sigmoid(a * logit + b), fitted with population weights (Platt)."""
    if y.min() == y.max():
        return 1.0, 0.0  # nothing to fit against
    lr = LogisticRegression(C=1e6, max_iter=1000)
    lr.fit(logits.reshape(-1, 1).astype(np.float64), y, sample_weight=weight)
    return float(lr.coef_[0, 0]), float(lr.intercept_[0])


def weighted_ap(y: np.ndarray, score: np.ndarray, weight: np.ndarray) -> float:
    """PR-AUC (average precision) with population weights; nan without positives."""
    if y.sum() == 0:
        return float("nan")
    return float(average_precision_score(y, score, sample_weight=weight))


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
) -> tuple[HealthLSTM, dict[str, Any]]:
    """Train on the train split, early-stop and calibrate on the val split."""
    cfg = cfg or TrainConfig()
    say = progress or (lambda _m, _f: None)
    horizon_s = history.config.horizon_s
    torch.manual_seed(cfg.seed)
    threads_before = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        train, val = history.splits["train"], history.splits["val"]
        idx, y = training_indices(train, horizon_s, cfg)
        if y.sum() == 0:
            raise ValueError(
                "the train split holds no positive window: a longer history or a "
                "larger fleet is needed"
            )
        x = train.windows(idx)
        model = HealthLSTM(cfg.hidden, cfg.layers, history.config.window, BUCKET_S, horizon_s)
        mean, std = feature_stats(x)
        model.mean.copy_(torch.from_numpy(mean))
        model.std.copy_(torch.from_numpy(std))
        xt = torch.from_numpy(np.ascontiguousarray(x))
        yt = torch.from_numpy(y.astype(np.float32))
        n_pos = float(y.sum())
        pos_weight = min((len(y) - n_pos) / n_pos, cfg.pos_weight_max)
        loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(pos_weight))
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        val_x = val.windows()
        val_y = val.labels(horizon_s)
        best_ap, best_state, bad, history_ap = -1.0, None, 0, []
        started = time.perf_counter()
        g = torch.Generator().manual_seed(cfg.seed)
        for epoch in range(cfg.epochs):
            model.train()
            perm = torch.randperm(len(yt), generator=g)
            total = 0.0
            for i in range(0, len(perm), cfg.batch_size):
                b = perm[i : i + cfg.batch_size]
                opt.zero_grad()
                loss = loss_fn(model.logits(xt[b]), yt[b])
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                total += float(loss.detach()) * len(b)
            ap = weighted_ap(val_y, model.raw_logits(val_x), val.weight)
            ap = -math.inf if math.isnan(ap) else ap
            history_ap.append(ap)
            say(
                f"epoch {epoch + 1}/{cfg.epochs}: loss {total / len(yt):.4f}, val PR-AUC {ap:.4f}",
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
        a, b = fit_calibration(model.raw_logits(val_x), val_y, val.weight)
        model.calibration.copy_(torch.tensor([a, b]))
        model.eval()
        info = {
            "train_windows": len(y),
            "train_positives": int(n_pos),
            "pos_weight": pos_weight,
            "epochs_run": len(history_ap),
            "val_pr_auc_by_epoch": history_ap,
            "val_pr_auc": best_ap,
            "calibration": [a, b],
            "train_s": time.perf_counter() - started,
            "parameters": sum(p.numel() for p in model.parameters()),
        }
        return model, info
    finally:
        torch.set_num_threads(threads_before)


# -- the registry ------------------------------------------------------------------------------

_champion_cache: dict[str, tuple[str, HealthLSTM]] = {}


def champion_uri(name: str = REGISTERED_MODEL, alias: str = CHAMPION_ALIAS) -> str:
    return f"models:/{name}@{alias}"


def load_champion(name: str = REGISTERED_MODEL, alias: str = CHAMPION_ALIAS) -> HealthLSTM:
    """The model under ``alias`` in gpuflow's MLflow registry; cached per version, so a
    monitor loads it once and picks up a new champion on its next call."""
    import mlflow
    from gpuflow.tasks.tracking import tracking_uri
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    uri = tracking_uri()
    # The registry follows the store explicitly: mlflow keeps a process-wide registry URI
    # that would otherwise point at the first store this process used.
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    client = MlflowClient(uri, registry_uri=uri)
    try:
        version = client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        raise LookupError(
            f"no model {name!r} with alias {alias!r} in {uri}: train one first "
            "(`gpuflow health train` or the health_train flow)"
        ) from exc
    key = f"{uri}|{name}|{alias}"
    cached = _champion_cache.get(key)
    if cached is not None and cached[0] == version.version:
        return cached[1]
    model = mlflow.pytorch.load_model(f"models:/{name}/{version.version}", map_location="cpu")
    if not isinstance(model, HealthLSTM):
        raise LookupError(f"{name} v{version.version} is a {type(model).__name__}, not HealthLSTM")
    model.eval()
    _champion_cache[key] = (version.version, model)
    return model


__all__ = [
    "CHAMPION_ALIAS",
    "EXPERIMENT",
    "REGISTERED_MODEL",
    "HealthLSTM",
    "HealthModel",
    "TrainConfig",
    "champion_uri",
    "fit_calibration",
    "load_champion",
    "train_lstm",
    "training_indices",
    "weighted_ap",
]
