"""Splits of the fleet history (DESIGN.md section 6: by node and by time) and their
segments: an incident segment per failure in the split's time range, and background
segments from all the rest of the up-time, in two strata: whole stretches around
precursor-like noise (benign remaps, healed degradations: history_noise.noise_intervals)
drawn among all of them, and uniform segments at random devices and times elsewhere. Each
background window is weighted by how many population windows of its stratum it stands for
(the stratum's windows over the sampled ones), so the weights of a split's background sum
to its background device-time.
"""

from __future__ import annotations

import numpy as np
from gpuflow.hardware.sim.hazard import DAY_S
from gpuflow.tasks.health.features import BUCKET_S, N_FEATURES
from gpuflow.tasks.health.history_config import HistoryConfig, align_down, history_rng
from gpuflow.tasks.health.history_dataset import SplitData
from gpuflow.tasks.health.history_fleet import Device, Fault
from gpuflow.tasks.health.history_noise import noise_intervals
from gpuflow.tasks.health.history_series import Segment, simulate_segment


def split_of_nodes(cfg: HistoryConfig) -> np.ndarray:
    """Split number (0 train, 1 val, 2 test) per node: a seeded shuffle."""
    order = np.random.default_rng(cfg.seed).permutation(cfg.nodes)
    n_train = max(1, round(cfg.nodes * cfg.node_fractions[0]))
    n_val = max(1, round(cfg.nodes * cfg.node_fractions[1]))
    out = np.full(cfg.nodes, 2, dtype=np.int64)
    out[order[:n_train]] = 0
    out[order[n_train : n_train + n_val]] = 1
    return out


def split_time_ranges(cfg: HistoryConfig) -> list[tuple[float, float]]:
    total = cfg.days * DAY_S
    edges = np.concatenate([[0.0], np.cumsum(cfg.time_fractions)]) * total
    return [(float(edges[i]), float(edges[i + 1])) for i in range(3)]


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _n_ends(x: float, y: float) -> int:
    """Bucket ends in (x, y]: the windows a stretch holds."""
    return max(int(round((align_down(y) - align_down(x)) / BUCKET_S)), 0)


def _subtract(a: float, b: float, cuts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """[a, b] less the ranges ``cuts``."""
    out = [(a, b)]
    for x, y in cuts:
        out = [p for u, v in out for p in ((u, min(v, x)), (max(u, y), v)) if p[1] > p[0]]
    return out


def _noise_pieces(
    cfg: HistoryConfig, devs: list[Device], t0: float, t1: float, warm: float
) -> list[tuple[Device, float, float]]:
    """The noise stratum of a split: each device's noise intervals in [t0, t1], less its
    incidents and repair downtime (and a window's warm-up after them)."""
    out = []
    for d in devs:
        cuts = [(x, y + warm) for x, y in d.blocked()]
        for a, b in noise_intervals(cfg, d):
            for x, y in _subtract(max(a, t0), min(b, t1), cuts):
                if _n_ends(x, y) >= 1:
                    out.append((d, x, y))
    return out


def _next_failure(dev: Device, t: np.ndarray) -> np.ndarray:
    """The device's next failure after each time (inf: none in the history)."""
    times = np.sort(np.asarray([f.failure_s for f in dev.faults] + [np.inf]))
    return times[np.searchsorted(times, t, side="right")]


def build_split(
    cfg: HistoryConfig, name: str, si: int, devs: list[Device], t0: float, t1: float
) -> SplitData:
    w = cfg.window
    warm = (w - 1) * BUCKET_S
    segments: list[Segment] = []
    faults: list[Fault] = []
    by_ordinal = {d.ordinal: d for d in devs}
    # Incidents: failures inside the split's time range.
    for d in devs:
        prev_repair = 0.0
        for f in d.faults:
            if t0 <= f.failure_s < t1:
                start = align_down(max(f.incident_start_s(), prev_repair) - warm)
                start = max(start, align_down(prev_repair))
                n = int((f.failure_s - start) // BUCKET_S)
                if n >= w:
                    faults.append(f)
                    segments.append(Segment(d.ordinal, start, n, "incident", f))
            prev_repair = f.repaired_s
    # Population: device-time in range, less repair downtime; background: less incidents.
    span = t1 - t0
    device_s = len(devs) * span
    background_s = device_s
    for d in devs:
        for f in d.faults:
            device_s -= _overlap(f.failure_s, f.repaired_s, t0, t1)
            background_s -= _overlap(f.incident_start_s(), f.repaired_s, t0, t1)
    # Background, two strata. "noise": the stretches around precursor-like noise (benign
    # remaps, healed degradations), too rare in device-time for a uniform sample to hold
    # many, so whole stretches are drawn among them; "plain": the rest, uniform segments.
    # Each stratum's windows stand for its own population (weights below).
    pieces = _noise_pieces(cfg, devs, t0, t1, warm)
    rng = history_rng(cfg.seed, "background", name)
    noise_pop = sum(_n_ends(x, y) for _, x, y in pieces)
    n_noise = min(cfg.noise_segments[si], len(pieces))
    for i in sorted(rng.sample(range(len(pieces)), n_noise)):
        d, x, y = pieces[i]
        start = align_down(x) - warm
        segments.append(
            Segment(d.ordinal, start, int(round((align_down(y) - start) / BUCKET_S)), "noise")
        )
    noise_by_dev: dict[int, list[tuple[float, float]]] = {}
    for d, x, y in pieces:
        noise_by_dev.setdefault(d.ordinal, []).append((x, y))
    seg_s = cfg.background_segment_s[si]
    n_bg = cfg.background_segments[si]
    n_bucket = int(seg_s // BUCKET_S)
    placed = tries = 0
    while placed < n_bg and tries < n_bg * 50:
        tries += 1
        d = devs[rng.randrange(len(devs))]
        start = align_down(rng.uniform(t0, t1 - seg_s))
        a, b = start - warm, start + n_bucket * BUCKET_S
        if any(_overlap(a, b, x, y) > 0 for x, y in d.blocked()):
            continue
        if any(_overlap(start, b, x, y) > 0 for x, y in noise_by_dev.get(d.ordinal, [])):
            continue  # its windows would end in the noise stratum
        segments.append(Segment(d.ordinal, a, n_bucket + w - 1, "background"))
        placed += 1
    # Simulate every segment and lay out its windows.
    fault_row = {id(f): i for i, f in enumerate(faults)}
    n_noise_windows = 0
    bucket_parts: list[np.ndarray] = []
    end_rows, t_ends, ttfs, segs, kinds = [], [], [], [], []
    row = 0
    for si_, seg in enumerate(segments):
        b = simulate_segment(cfg, by_ordinal[seg.ordinal], seg)
        bucket_parts.append(b)
        k = np.arange(w - 1, seg.n)
        end_rows.append(row + k)
        t_end = seg.t0_s + (k + 1) * BUCKET_S
        t_ends.append(t_end)
        if seg.fault is not None:
            ttfs.append(seg.fault.failure_s - t_end)
        else:
            # Background is away from incidents, not from failures days ahead: the labels
            # of the longer horizons (up to 72 h) need the device's next failure.
            ttfs.append(_next_failure(by_ordinal[seg.ordinal], t_end) - t_end)
        segs.append(np.full(len(k), si_))
        kinds.append(0 if seg.kind == "incident" else 1)
        n_noise_windows += len(k) if seg.kind == "noise" else 0
        row += seg.n
    buckets = (
        np.concatenate(bucket_parts).astype(np.float32)
        if bucket_parts
        else np.zeros((0, N_FEATURES), np.float32)
    )
    end_row = np.concatenate(end_rows) if end_rows else np.zeros(0, np.int64)
    seg_arr = np.concatenate(segs) if segs else np.zeros(0, np.int64)
    seg_kind = np.asarray(kinds, dtype=np.int64)
    is_bg = seg_kind[seg_arr] == 1 if len(seg_arr) else np.zeros(0, bool)
    is_noise = np.zeros(len(end_row), dtype=bool)
    if len(seg_arr):
        noise_seg = np.asarray([s.kind == "noise" for s in segments])
        is_noise = noise_seg[seg_arr]
    sampled_bg_s = (placed * n_bucket + n_noise_windows) * BUCKET_S
    weight = np.ones(len(end_row), dtype=np.float64)
    plain_pop = max(background_s / BUCKET_S - noise_pop, 0.0)
    if placed:
        weight[is_bg & ~is_noise] = plain_pop / (placed * n_bucket)
    if n_noise_windows:
        weight[is_noise] = noise_pop / n_noise_windows
    return SplitData(
        name=name,
        buckets=buckets,
        end_row=end_row.astype(np.int64),
        t_end_s=np.concatenate(t_ends) if t_ends else np.zeros(0),
        ttf_s=np.concatenate(ttfs) if ttfs else np.zeros(0),
        seg=seg_arr.astype(np.int64),
        weight=weight,
        seg_ordinal=np.asarray([s.ordinal for s in segments], dtype=np.int64),
        seg_kind=seg_kind,
        seg_fault=np.asarray(
            [fault_row[id(s.fault)] if s.fault is not None else -1 for s in segments],
            dtype=np.int64,
        ),
        fail_ordinal=np.asarray([f.ordinal for f in faults], dtype=np.int64),
        fail_kind=np.asarray([f.kind for f in faults], dtype="U24"),
        fail_s=np.asarray([f.failure_s for f in faults], dtype=np.float64),
        fail_onset_s=np.asarray([f.onset_s for f in faults], dtype=np.float64),
        fail_lemon=np.asarray([by_ordinal[f.ordinal].lemon for f in faults], dtype=bool),
        device_days=device_s / DAY_S,
        background_device_days=max(background_s, 0.0) / DAY_S,
        sampled_background_device_days=sampled_bg_s / DAY_S,
        window=w,
    )


CALIBRATION_SHARE = 0.5  # of the validation split's nodes


def carve_calibration(
    val: SplitData, cfg: HistoryConfig, share: float = CALIBRATION_SHARE
) -> tuple[SplitData, SplitData]:
    """(validation, calibration): the val split's nodes shuffled (seeded) into two groups,
    so calibration is fitted on devices that neither trained the model nor chose it."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"the calibration share must be in (0, 1), got {share}")
    nodes = np.unique(val.seg_ordinal // cfg.gpus_per_node)
    order = np.random.default_rng([cfg.seed, 7]).permutation(nodes)
    n_cal = min(max(1, round(len(nodes) * share)), max(len(nodes) - 1, 1))
    cal_nodes = order[:n_cal]
    in_cal = np.isin(val.seg_ordinal // cfg.gpus_per_node, cal_nodes)
    frac = n_cal / max(len(nodes), 1)
    return val.subset(~in_cal, "val", 1.0 - frac), val.subset(in_cal, "cal", frac)
