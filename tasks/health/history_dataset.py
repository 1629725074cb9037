"""The fleet history as data: labelled windows per split (``SplitData``) and the whole
history (``History``) with its on-disk form (one .npz, versioned).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gpuflow.tasks.health.features import FEATURES
from gpuflow.tasks.health.history_config import HISTORY_VERSION, SPLITS, HistoryConfig


@dataclass
class SplitData:
    """One split: bucket rows, windows over them, the failures they hold, population sizes.

    Window arrays (one entry per window): ``end_row`` (row of its newest bucket in
    ``buckets``), ``t_end_s``, ``ttf_s`` (seconds from the window's end to the device's
    next failure in the segment; inf when none), ``seg`` (segment number), ``weight``
    (population windows it stands for). Segment arrays: ``seg_ordinal``, ``seg_kind``
    (0 incident, 1 background), ``seg_fault`` (row in the failure table or -1).
    Failure table: ``fail_ordinal``, ``fail_kind`` (class name), ``fail_s``, ``fail_onset_s``,
    ``fail_lemon``.
    """

    name: str
    buckets: np.ndarray
    end_row: np.ndarray
    t_end_s: np.ndarray
    ttf_s: np.ndarray
    seg: np.ndarray
    weight: np.ndarray
    seg_ordinal: np.ndarray
    seg_kind: np.ndarray
    seg_fault: np.ndarray
    fail_ordinal: np.ndarray
    fail_kind: np.ndarray
    fail_s: np.ndarray
    fail_onset_s: np.ndarray
    fail_lemon: np.ndarray
    device_days: float  # the split's devices x its time range, less repair downtime
    background_device_days: float  # of which away from incidents (what bg segments sample)
    sampled_background_device_days: float
    window: int

    def windows(self, idx: np.ndarray | None = None) -> np.ndarray:
        """[len(idx), window, F] float32 (all windows when idx is None)."""
        rows = self.end_row if idx is None else self.end_row[idx]
        offsets = np.arange(-self.window + 1, 1)
        return self.buckets[rows[:, None] + offsets[None, :]]

    def labels(self, horizon_s: float) -> np.ndarray:
        return ((self.ttf_s > 0) & (self.ttf_s <= horizon_s)).astype(np.float32)

    def subset(self, keep_seg: np.ndarray, name: str, share: float) -> SplitData:
        """The segments ``keep_seg`` (bool per segment) as a split of their own, standing
        for ``share`` of this split's device-time (the buckets are shared, not copied).
        Background weights stay: a uniform sample restricted to a share of the devices
        stands for that share of the population."""
        keep_seg = np.asarray(keep_seg, dtype=bool)
        win = keep_seg[self.seg]
        new_seg = np.cumsum(keep_seg) - 1
        faults = self.seg_fault[keep_seg]
        fail_keep = np.zeros(len(self.fail_s), dtype=bool)
        fail_keep[faults[faults >= 0]] = True
        new_fail = np.cumsum(fail_keep) - 1
        # Indexed only where a segment has a fault: a split with none has no new_fail[0].
        seg_fault = np.full(len(faults), -1, dtype=self.seg_fault.dtype)
        seg_fault[faults >= 0] = new_fail[faults[faults >= 0]]
        return SplitData(
            name=name,
            buckets=self.buckets,
            end_row=self.end_row[win],
            t_end_s=self.t_end_s[win],
            ttf_s=self.ttf_s[win],
            seg=new_seg[self.seg[win]],
            weight=self.weight[win],
            seg_ordinal=self.seg_ordinal[keep_seg],
            seg_kind=self.seg_kind[keep_seg],
            seg_fault=seg_fault,
            fail_ordinal=self.fail_ordinal[fail_keep],
            fail_kind=self.fail_kind[fail_keep],
            fail_s=self.fail_s[fail_keep],
            fail_onset_s=self.fail_onset_s[fail_keep],
            fail_lemon=self.fail_lemon[fail_keep],
            device_days=self.device_days * share,
            background_device_days=self.background_device_days * share,
            sampled_background_device_days=self.sampled_background_device_days * share,
            window=self.window,
        )

    @property
    def n_windows(self) -> int:
        return len(self.end_row)

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        out = {}
        for k, v in self.__dict__.items():
            if isinstance(v, np.ndarray):
                out[prefix + k] = v
        out[prefix + "scalars"] = np.array(
            [
                self.device_days,
                self.background_device_days,
                self.sampled_background_device_days,
                self.window,
            ],
            dtype=np.float64,
        )
        return out

    @classmethod
    def from_arrays(cls, name: str, z: Any, prefix: str) -> SplitData:
        kw = {
            k[len(prefix) :]: z[k]
            for k in z.files
            if k.startswith(prefix) and k != prefix + "scalars"
        }
        dd, bdd, sbdd, w = z[prefix + "scalars"]
        return cls(
            name=name,
            device_days=float(dd),
            background_device_days=float(bdd),
            sampled_background_device_days=float(sbdd),
            window=int(w),
            **kw,
        )


@dataclass
class History:
    config: HistoryConfig
    splits: dict[str, SplitData]
    stats: dict[str, Any]

    def save(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        for name, sp in self.splits.items():
            arrays.update(sp.to_arrays(f"{name}__"))
        meta = {
            "config": self.config.model_dump(mode="json"),
            "stats": self.stats,
            "version": HISTORY_VERSION,
            "features": list(FEATURES),
        }
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **arrays)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> History:
        with np.load(Path(path), allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            if meta.get("version") != HISTORY_VERSION:
                raise ValueError(
                    f"{path}: history version {meta.get('version')!r}, expected {HISTORY_VERSION}"
                )
            if meta.get("features") != list(FEATURES):
                raise ValueError(f"{path}: saved with other features than this code computes")
            splits = {s: SplitData.from_arrays(s, z, f"{s}__") for s in SPLITS}
        return cls(HistoryConfig(**meta["config"]), splits, meta["stats"])
