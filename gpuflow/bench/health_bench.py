"""Health model: scoring throughput of a large fleet, and the test-split figures.

1. Scoring: 10,000 devices, one core (torch and the BLAS/OpenMP pools held to one
   thread). A round is what the monitor does per sample: fold 10,000 telemetry samples
   into the windows, assemble 10,000 windows, run the LSTM on them. The goal (issue 4):
   well under the 5 s sampling interval; reported as ``interval_s / round_s`` (how many
   rounds fit in one interval), median of several rounds, for a round inside a bucket and
   one that closes a bucket. Sampling the devices is the backend's cost, not included.
2. Figures with 95 % CIs (tasks.health.uncertainty): rules, GBT, LSTM, random and oracle
   trained on several twin histories (one per seed) and evaluated on their test splits:
   per-class recall, precision, false alarms and net GPU-h saved per 1,000 device-days,
   Brier and ECE, bootstrap over seeds and devices, "n=7 <20" where a figure rests on
   fewer than 20 events.
3. Noise sweep: the same over the precursor-noise knobs (silent HBM failures, benign
   pending remaps), quiet -> very noisy, each learned model's net saved minus the rules'
   with a paired interval, and the crossover computed from them.
4. Cordon sweep: the main table's models re-judged (no retraining) under what a cordon
   costs (tasks.health.decision): how long it holds a device acted on (episodes under it
   move nothing) and the share of that time the device would have run work; each learned
   model's net saved minus the rules' with a paired interval, and the crossover.
Quick: 48-node x 60-day fleets, 2 seeds, 3 sweep settings of 1 seed, 3 cordon settings, the
small LSTM (a smoke run, about 1.5 min); full: 96 x 120 days, 3 seeds, 4 settings x 2 seeds,
7 cordon settings, the LSTM as health_train ships it. Recorded in MLflow (experiment
gpuflow-health, run bench-health: the first seed's models and plots, every
CI figure as a metric, the whole result as evaluation/health_ci.json).
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from gpuflow.hardware.backend import TelemetrySample
from gpuflow.tasks.health.features import BUCKET_S
from gpuflow.tasks.health.fleet_windows import FleetWindows
from gpuflow.tasks.health.model import HealthLSTM, TrainConfig
from gpuflow.tasks.health.sampler import DEFAULT_INTERVAL_S

DEVICES = 10_000


def synthetic_round(n: int, t_s: float, rng: np.random.Generator) -> list[TelemetrySample]:
    """One sample of ``n`` A100-like devices at ``t_s`` (values in their usual ranges)."""
    temp = rng.uniform(35.0, 80.0, n)
    power = rng.uniform(60_000, 400_000, n).astype(int)
    util = rng.uniform(0.0, 1.0, n)
    ecc = rng.poisson(2.0, n)
    xid_dev = set(rng.choice(n, max(1, n // 1000), replace=False).tolist())
    return [
        TelemetrySample(
            node=f"n{i // 8:05d}",
            index=i % 8,
            timestamp_s=t_s,
            present=True,
            temperature_c=float(temp[i]),
            power_mw=int(power[i]),
            energy_mj=0,
            utilization_ratio=float(util[i]),
            memory_used_mb=int(util[i] * 30_000),
            memory_total_mb=40_960,
            sm_clock_mhz=1410,
            power_limit_mw=400_000,
            ecc_corrected_total=int(ecc[i]),
            clock_event_reasons=("SwPowerCap",) if power[i] > 390_000 else (),
            xids=(63,) if i in xid_dev else (),
        )
        for i in range(n)
    ]


def bench_scoring(
    n_devices: int = DEVICES,
    rounds: int = 5,
    hidden: int | None = None,
    report: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Time the monitor's per-round work for ``n_devices`` on one core."""
    hidden = hidden or TrainConfig().hidden
    model = HealthLSTM(hidden=hidden).eval()
    rng = np.random.default_rng(0)
    clocks = [1410.0] * n_devices
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(1):
            fw = FleetWindows(model.window)
            t0 = 1_700_000_000.0
            report(f"filling {n_devices} windows")
            for k in range(model.window):  # one sample per bucket fills the windows
                fw.update(synthetic_round(n_devices, t0 + k * BUCKET_S, rng), clocks)
            t = t0 + (model.window - 1) * BUCKET_S
            parts: dict[str, list[float]] = {
                "update": [],
                "windows": [],
                "predict": [],
                "round": [],
                "closing_round": [],
            }
            for r in range(rounds):
                report(f"scoring round {r + 1}/{rounds}")
                for closing in (False, True):
                    t += BUCKET_S if closing else DEFAULT_INTERVAL_S
                    samples = synthetic_round(n_devices, t, rng)
                    a = time.perf_counter()
                    fw.update(samples, clocks)
                    b = time.perf_counter()
                    win = fw.windows()
                    c = time.perf_counter()
                    risk = model.predict_risk(win)
                    d = time.perf_counter()
                    assert len(risk) == n_devices
                    if closing:
                        parts["closing_round"].append(d - a)
                    else:
                        parts["update"].append(b - a)
                        parts["windows"].append(c - b)
                        parts["predict"].append(d - c)
                        parts["round"].append(d - a)
    finally:
        torch.set_num_threads(before)
    med = {k: statistics.median(v) for k, v in parts.items()}
    return {
        "devices": n_devices,
        "threads": 1,
        "lstm_hidden": hidden,
        "update_s": round(med["update"], 4),
        "windows_s": round(med["windows"], 4),
        "predict_s": round(med["predict"], 4),
        "round_s": round(med["round"], 4),
        "closing_round_s": round(med["closing_round"], 4),
        "interval_s": DEFAULT_INTERVAL_S,
        "interval_to_round_ratio": round(DEFAULT_INTERVAL_S / med["round"], 1),
        "interval_to_closing_round_ratio": round(DEFAULT_INTERVAL_S / med["closing_round"], 1),
        "devices_per_s": round(n_devices / med["round"]),
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


MODELS = ("rules", "gbt", "lstm", "random", "oracle")
LEARNED = ("gbt", "lstm")
# The precursor-noise knobs swept, quiet -> noisy: the share of HBM failures with no
# precursor (hardware.sim.hazard.hbm_silent_share) and benign pending remaps per healthy
# device-day (hardware.sim.noise.benign_remap_per_day). "default" is the twin's own.
NOISE_SETTINGS: tuple[tuple[str, float, float], ...] = (
    ("quiet", 0.0, 0.0),
    ("default", 0.30, 2e-3),
    ("noisy", 0.50, 1e-2),
    ("very noisy", 0.70, 3e-2),
)
QUICK_NOISE = ("quiet", "default", "very noisy")
# Off the sweep's diagonal: each knob at its "very noisy" value, the other at 0, to tell
# which of them takes the rules' advantage away (full run only; not in the crossover,
# which reads the diagonal in order).
OFF_DIAGONAL: tuple[tuple[str, float, float], ...] = (
    ("benign remaps only", 0.0, 3e-2),
    ("silent failures only", 0.70, 0.0),
)
# What a cordon costs, cheap -> dear: how long it holds a device acted on, and the share of
# that time the device would have run work. No public figure fixes either; "move only" is
# the default (every episode a move, the device's time not priced).
CORDON_SETTINGS: tuple[tuple[str, float, float], ...] = (
    ("move only", 0.0, 0.0),
    ("4 h hold, free", 4 * 3600.0, 0.0),
    ("24 h hold, free", 24 * 3600.0, 0.0),
    ("4 h hold, half booked", 4 * 3600.0, 0.5),
    ("4 h hold, fully booked", 4 * 3600.0, 1.0),
    ("24 h hold, half booked", 24 * 3600.0, 0.5),
    ("24 h hold, fully booked", 24 * 3600.0, 1.0),
)
QUICK_CORDON = ("move only", "4 h hold, free", "4 h hold, fully booked")
MAIN_MEASURES = (
    ("precision", "precision", "{:.2f}"),
    *(
        (f"recall {c}", f"recall_{c}", "{:.2f}")
        for c in ("hbm", "thermal", "xid79", "ecc-uncorrectable")
    ),
    ("recall, all", "recall", "{:.2f}"),
    ("false alarms / 1000 dd", "fa_per_1000_dd", "{:.1f}"),
    ("net GPU-h saved / 1000 dd", "net_saved_gpu_h_per_1000_dd", "{:.1f}"),
    ("Brier", "brier", "{:.2e}"),
    ("ECE", "ece", "{:.2e}"),
)
SWEEP_MEASURES = (
    ("recall", "recall", "{:.2f}"),
    ("precision", "precision", "{:.2f}"),
    ("net GPU-h saved / 1000 dd", "net_saved_gpu_h_per_1000_dd", "{:.1f}"),
)


def _machine() -> dict[str, Any]:
    return {
        "cpu": _cpu_name(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def risks_on_test(history: Any, outcome: Any) -> dict[str, np.ndarray]:
    """Each of rules, GBT and LSTM's risk per test window at its chosen horizon."""
    from gpuflow.tasks.health.pipeline import score_split

    test = history.splits["test"]
    return {m: score_split(outcome.model(m), test) for m in ("rules", *LEARNED)}


def seed_rows(
    history: Any,
    outcome: Any,
    defaults: Any = None,
    risks: dict[str, np.ndarray] | None = None,
) -> np.ndarray:
    """Per test device the bootstrap columns of every model of MODELS, each as it is run:
    GBT and LSTM at the cost rule's break-even risk for their chosen horizon (what the
    monitor does), rules at 0.5, random at the LSTM's alert rate, oracle at the
    champion's horizon. ``defaults`` (a decision.CostDefaults): the cordon's hold and
    price, in the break-even risk and in which episodes move anything; ``risks``: those
    of ``risks_on_test``, when already scored."""
    from gpuflow.tasks.health import uncertainty as u
    from gpuflow.tasks.health.baselines import oracle_scores, random_scores
    from gpuflow.tasks.health.champion import decision_threshold, reference_costs
    from gpuflow.tasks.health.evaluate import random_threshold_for
    from gpuflow.tasks.remediation.alarm_stream import split_devices

    test = history.splits["test"]
    hz = outcome.horizons
    risks = risks or risks_on_test(history, outcome)
    costs = reference_costs(defaults)
    hold = defaults.cordon_hold_s if defaults is not None else 0.0

    def run(r: np.ndarray, t: float, h: float) -> Any:
        return u.model_run(test, r, t, h, hold)

    runs: dict[str, Any] = {"rules": run(risks["rules"], 0.5, hz["rules"])}
    for name in LEARNED:
        runs[name] = run(risks[name], decision_threshold(hz[name], costs), hz[name])
    t_lstm = decision_threshold(hz["lstm"], costs)
    rate = float(np.average(runs["lstm"].risk >= t_lstm, weights=test.weight))
    rand = random_scores(test.n_windows, seed=history.config.seed)
    runs["random"] = run(rand, random_threshold_for(rate), hz["lstm"])
    h = hz[outcome.champion]
    runs["oracle"] = run(oracle_scores(test, h), 0.5, h)
    facts = u.split_facts(test, split_devices(history.config, "test"))
    return u.device_rows(facts, {m: runs[m] for m in MODELS})


def _train_seed(hc: Any, tc: Any, gc: Any, report: Callable[[str], None]) -> tuple[Any, Any]:
    from gpuflow.tasks.health.history import load_or_generate
    from gpuflow.tasks.health.pipeline import train_and_evaluate

    history, _ = load_or_generate(hc)
    outcome = train_and_evaluate(
        hc,
        tc,
        gc,
        history=history,
        cache=False,
        progress=lambda m, f: report(f"seed {hc.seed}: {m}"),
    )
    return history, outcome


def _rows(study: Any, measures: tuple[tuple[str, str, str], ...]) -> dict[str, str]:
    """'<model>: <measure>' -> 'mean [lo, hi]' (with 'n=7 <20' when it rests on few)."""
    from gpuflow.tasks.health.uncertainty import fmt

    return {
        f"{m}: {label}": fmt(study.table[m][key], spec)
        for m in study.table
        for label, key, spec in measures
    }


@dataclass(frozen=True)
class Plan:
    """How much to run: the fleet (HistoryConfig.small overrides), the history seeds of
    the main table and of each sweep setting, the sweep's settings, the resamples."""

    size: dict[str, Any]
    main_seeds: tuple[int, ...]
    sweep_seeds: tuple[int, ...]
    settings: tuple[str, ...]
    resamples: int
    gbt_max_iter: int
    cordon: tuple[str, ...] = QUICK_CORDON
    lstm_small: bool = True  # TrainConfig.small() (a smoke run) or the shipped default
    off_diagonal: tuple[str, ...] = ()
    # The main table again on the production fleet at the twin's real fault rate
    # (HistoryConfig(seed=s, **real_size)), re-judged under each cordon setting of the plan.
    real_seeds: tuple[int, ...] = ()
    real_size: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, quick: bool) -> Plan:
        if quick:  # a smoke run: small fleets, few seeds, wide intervals
            return cls({"nodes": 48, "days": 60.0}, (1, 2), (1,), QUICK_NOISE, 300, 50)
        every = tuple(n for n, *_ in CORDON_SETTINGS)
        noise = tuple(n for n, *_ in NOISE_SETTINGS)
        # The LSTM as health_train ships it (TrainConfig()), beside the shipped GBT.
        off = tuple(n for n, *_ in OFF_DIAGONAL)
        return cls({}, (1, 2, 3), (1, 2), noise, 1000, 150, every, False, off, (1, 2, 3))


def _versus_rules(st: Any) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """Each learned model's net saved minus the rules' (paired), and as printed."""
    from gpuflow.tasks.health import uncertainty as u

    d = {m: u.difference(st, m, "rules", "net_saved_gpu_h_per_1000_dd") for m in LEARNED}
    return d, {
        f"{m} - rules: net GPU-h saved / 1000 dd": f"{x['mean']:+.1f} "
        f"[{x['lo']:+.1f}, {x['hi']:+.1f}] ({u.verdict(x)})"
        for m, x in d.items()
    }


def run_uncertainty(
    quick: bool, report: Callable[[str], None] = print, plan: Plan | None = None
) -> dict[str, Any]:
    """The main table (every model, every figure, 95 % CIs over devices and history seeds)
    and the noise sweep with its crossover (tasks.health.uncertainty)."""
    from gpuflow.hardware.sim.hazard import HazardModel
    from gpuflow.hardware.sim.noise import NoiseModel
    from gpuflow.tasks.health import uncertainty as u
    from gpuflow.tasks.health.baselines import GbtConfig
    from gpuflow.tasks.health.history import HistoryConfig

    plan = plan or Plan.of(quick)
    tc = TrainConfig.small() if plan.lstm_small else TrainConfig()
    gc = GbtConfig(max_iter=plan.gbt_max_iter)
    size, main_seeds, sweep_seeds, resamples = (
        plan.size,
        plan.main_seeds,
        plan.sweep_seeds,
        plan.resamples,
    )
    started = time.perf_counter()
    rows = []
    trained = []
    first = None
    for s in main_seeds:
        report(f"main table: history seed {s}")
        history, outcome = _train_seed(HistoryConfig.small(seed=s, **size), tc, gc, report)
        first = first or outcome
        trained.append((history, outcome, risks_on_test(history, outcome)))
        rows.append(seed_rows(history, outcome, risks=trained[-1][2]))
    by_seed = {
        s: (r, o.champion) for s, r, (_, o, _) in zip(main_seeds, rows, trained, strict=True)
    }
    twin = (HazardModel().hbm_silent_share, NoiseModel().benign_remap_per_day)
    main = u.study(rows, MODELS, resamples=resamples)
    t_main = time.perf_counter() - started
    settings = [x for x in NOISE_SETTINGS if x[0] in plan.settings]
    sections: dict[str, dict[str, str]] = {}
    raw: dict[str, Any] = {"main": main.table}
    diffs = []

    def setting(kind: str, key: str, label: str, silent: float, remaps: float) -> dict[str, Any]:
        """One twin setting over the sweep's seeds: its study, learned minus rules, and
        which model the cost rule chose on each seed's validation split."""
        srows, champions = [], []
        for s in sweep_seeds:
            if (silent, remaps) == twin and s in by_seed:  # the main table's own history
                row, champion = by_seed[s]
            else:
                report(f"{kind} {label}: history seed {s}")
                hc = HistoryConfig.small(
                    seed=s,
                    hazard_overrides={"hbm_silent_share": silent},
                    noise={"benign_remap_per_day": remaps},
                    **size,
                )
                history, outcome = _train_seed(hc, tc, gc, report)
                row, champion = seed_rows(history, outcome), outcome.champion
            srows.append(row)
            champions.append(champion)
        st = u.study(srows, MODELS, resamples=resamples)
        d, printed = _versus_rules(st)
        knobs = f"hbm_silent_share {silent:g}, benign_remap_per_day {remaps:g}"
        printed["champion on validation, by seed"] = ", ".join(champions)
        sections[f"{kind}: {label} ({knobs}; {st.failures} failures)"] = (
            _rows(st, SWEEP_MEASURES) | printed
        )
        raw[f"{key} {label}"] = {"knobs": knobs, "table": st.table, "vs rules": d}
        return d

    for label, silent, remaps in settings:
        diffs.append((label, setting("noise sweep", "sweep", label, silent, remaps)))
    for label, silent, remaps in [x for x in OFF_DIAGONAL if x[0] in plan.off_diagonal]:
        setting("off the diagonal", "off diagonal", label, silent, remaps)
    finding = u.crossover(diffs)
    t_sweep = time.perf_counter() - started - t_main
    if plan.real_seeds:
        sections |= _real_rate(plan, tc, gc, report, raw)
    t_real = time.perf_counter() - started - t_main - t_sweep
    cordon_diffs = []
    for label, hold, price in [x for x in CORDON_SETTINGS if x[0] in plan.cordon]:
        report(f"cordon sweep: {label}")
        st, d, printed = _rejudged(trained, hold, price, resamples)
        cordon_diffs.append((label, d))
        knobs = f"cordon_hold_s {hold:g}, cordon_price {price:g}"
        sections[f"cordon sweep: {label} ({knobs})"] = _rows(st, SWEEP_MEASURES) | printed
        raw[f"cordon {label}"] = {"knobs": knobs, "table": st.table, "vs rules": d}
    out: dict[str, Any] = {
        "setup": {
            "main": f"{main.seeds} history seeds ({', '.join(map(str, main_seeds))}), "
            f"{main.devices} test devices, {main.device_days:.0f} device-days, "
            f"{main.failures} failures; HistoryConfig.small({size or ''}), "
            f"TrainConfig({'small' if plan.lstm_small else 'default'}: hidden {tc.hidden}, "
            f"{tc.epochs} epochs), GbtConfig(max_iter={gc.max_iter})",
            "sweep": f"{len(sweep_seeds)} history seed(s) per setting, on the diagonal "
            "(both knobs together) and off it (one knob at a time)",
            "resamples": str(resamples),
            "operating points": "gbt, lstm: the cost rule's break-even risk at their chosen "
            "horizon; rules 0.5; random at the LSTM's alert rate; oracle at the champion's "
            "horizon",
            "net saved": "detected x G(T/2+R) - alarms x G(C+M), reference job of "
            "tasks.health.champion, GPU-h per 1000 device-days",
            "intervals": "95 % bootstrap over history seeds and devices; 'n=7 <20': the "
            "figure rests on fewer than 20 events",
            "main wall time, s": f"{t_main:.1f}",
            "sweep wall time, s": f"{t_sweep:.1f}",
            "real fault rate": f"{len(plan.real_seeds)} history seed(s) "
            f"({', '.join(map(str, plan.real_seeds))}) of HistoryConfig({plan.real_size or ''}),"
            " the same model configs; move only and each cordon setting; "
            f"{t_real:.1f} s",
            "cordon sweep": "the main table's seeds and models, re-judged: thresholds at the "
            "break-even (A + K) / (F + K), episodes under a standing cordon move nothing, "
            "K = hold x price charged per false alarm",
        },
        "health: test splits, mean [95 % CI]": _rows(main, MAIN_MEASURES),
        **sections,
        "noise sweep: finding": {"crossover": finding},
        "cordon sweep: finding": {"crossover": u.crossover(cordon_diffs)},
        "figures": [raw],  # a list: the CLI prints only the dict sections
    }
    for title, rows in out.items():
        if isinstance(rows, dict) and title != "setup":
            report(title)
            for k, v in rows.items():
                report(f"  {k}: {v}")
    out["_outcome"] = first
    return out


def _rejudged(
    trained: list[tuple[Any, Any, dict[str, np.ndarray]]], hold: float, price: float, resamples: int
) -> tuple[Any, dict[str, dict[str, float]], dict[str, str]]:
    """The trained seeds' test risks judged again (no retraining) under a cordon's hold and
    price: the study, each learned model's net saved minus the rules', and as printed."""
    from gpuflow.tasks.health import uncertainty as u
    from gpuflow.tasks.health.decision import CostDefaults

    defaults = CostDefaults(cordon_hold_s=hold, cordon_price=price)
    rows = [seed_rows(h, o, defaults, r) for h, o, r in trained]
    st = u.study(rows, MODELS, u.ActCosts.reference(defaults), resamples=resamples)
    return (st, *_versus_rules(st))


def _real_rate(
    plan: Plan, tc: Any, gc: Any, report: Callable[[str], None], raw: dict[str, Any]
) -> dict[str, dict[str, str]]:
    """The main table on the production fleet at its real fault rate, and under each of
    the plan's cordon settings. HistoryConfig.small() raises the fault rate ninefold so
    that a small fleet fails often enough, while benign pending remaps keep their real
    rate: a remap is then likelier to precede a failure than it is on a real fleet, which
    flatters the rules. This section says what the models do where that is not so."""
    from gpuflow.tasks.health.history import HistoryConfig

    trained, champions = [], []
    for s in plan.real_seeds:
        report(f"real fault rate: history seed {s}")
        history, outcome = _train_seed(HistoryConfig(seed=s, **plan.real_size), tc, gc, report)
        trained.append((history, outcome, risks_on_test(history, outcome)))
        champions.append(outcome.champion)
    hc = trained[0][0].config
    sections: dict[str, dict[str, str]] = {}
    # move only (the default) always; then each cordon setting of the plan
    for label, hold, price in [x for x in CORDON_SETTINGS if x[0] in ("move only", *plan.cordon)]:
        st, d, printed = _rejudged(trained, hold, price, plan.resamples)
        printed["champion on validation, by seed"] = ", ".join(champions)
        fleet = f"{hc.nodes} nodes x {hc.days:g} days, {st.failures} failures"
        sections[f"real fault rate: {label} ({fleet})"] = _rows(st, SWEEP_MEASURES) | printed
        raw[f"real rate {label}"] = {"knobs": fleet, "table": st.table, "vs rules": d}
    return sections


def _ci_metrics(result: dict[str, Any]) -> dict[str, float]:
    """MLflow metrics: ci_<model>_<figure>[_lo|_hi], sweep_<setting>_<model>_<figure> and
    off_diagonal_<setting>_<model>_<figure>."""
    out: dict[str, float] = {}

    def put(prefix: str, table: dict[str, dict[str, dict[str, Any]]]) -> None:
        for m, figs in table.items():
            for fig, c in figs.items():
                for k, suffix in (("mean", ""), ("lo", "_lo"), ("hi", "_hi")):
                    v = c[k]
                    if isinstance(v, float) and math.isfinite(v):
                        key = re.sub(r"[^\w]", "_", f"{prefix}_{m}_{fig}{suffix}")
                        out[key] = v

    raw = result["figures"][0]
    put("ci", raw["main"])
    for label, row in raw.items():
        if label != "main":
            put(label.replace(" ", "_"), row["table"])
    return out


def run(quick: bool = False, report: Callable[[str], None] = print) -> dict[str, Any]:
    import mlflow

    from gpuflow.tasks.health.pipeline import log_outcome

    started = time.perf_counter()
    machine = _machine()
    scoring = bench_scoring(rounds=3 if quick else 7, report=report)
    report(f"scoring: {scoring['round_s']} s per round of {scoring['devices']} devices")
    result = run_uncertainty(quick, report)
    outcome = result.pop("_outcome")
    recorded = log_outcome(outcome, register=False, run_name="bench-health")
    with mlflow.start_run(run_id=recorded["run_id"]):
        mlflow.log_metrics(_ci_metrics(result))
        mlflow.log_text(json.dumps(result, indent=2, default=str), "evaluation/health_ci.json")
    return {
        "machine": machine,
        "scoring": scoring,
        **result,
        "mlflow_run_id": recorded["run_id"],
        "quick": quick,
        "wall time, s": round(time.perf_counter() - started, 1),
    }
