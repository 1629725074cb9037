"""Section (b) of `gpuflow bench train`: fp32 vs fixed bf16 vs `auto`, as a comparison.

* **Interleaved.** One round per seed runs every arm once (the byte-lm under fp32, bf16
  and auto, and the reference block of DESIGN.md section 5 under fp32 and bf16), the order
  rotated from round to round, so a drift of the machine's speed (another process, turbo,
  page cache) falls on every arm alike instead of on whichever ran last.
* **Seeds.** Each round has its own seed (weights and data order), the same for every arm
  of the round: ratios and deltas are paired by seed, then summarised as mean, std and a
  95 % t interval over the seeds.
* **Two speedups.** Step speedup: fp32's time inside steps over the arm's (what the
  precision changes). Wall speedup: the same for the whole run (build, data, eval and
  the checkpoint included): what a user waits.
* **Convergence against noise.** The delta of an arm's final eval loss from fp32's is set
  against fp32's own seed-to-seed spread: a delta under 3 std of that spread cannot be
  told from a change of seed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuflow.bench.reference_block import ReferenceConfig, train_reference
from gpuflow.tasks.training.loop import StepInfo, train_loop
from gpuflow.tasks.training.precision import PrecisionError, validate_policy
from gpuflow.tasks.training.spec import TrainSpec
from gpuflow.tasks.training.storage import LocalStorage
from gpuflow.tasks.training.utilization import BusyShare

Report = Callable[[str], None]

LM_POLICIES = ("fp32", "bf16", "auto")
REF_POLICIES = ("fp32", "bf16")


def _t95(n: int) -> float:
    """Two-sided 95 % Student t quantile for n samples (n - 1 degrees of freedom)."""
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1)) if n > 1 else math.nan


def describe(values: Sequence[float]) -> dict[str, float]:
    """mean, std (n - 1), and the 95 % t interval of the mean (nan with one value)."""
    n = len(values)
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if n > 1 else math.nan
    half = _t95(n) * std / math.sqrt(n) if n > 1 else math.nan
    return {"mean": mean, "std": std, "ci95_low": mean - half, "ci95_high": mean + half}


def _lm_run(policy: str, seed: int, *, model: str, steps: int, root: Path) -> dict[str, Any]:
    step_times: list[float] = []

    def hook(info: StepInfo) -> None:
        step_times.append(info.step_time_s)

    spec = TrainSpec(
        job_id=f"bench-{model}-{policy}-s{seed}",
        model=model,
        steps=steps,
        checkpoint_interval=steps,
        precision=policy,
        seed=seed,
    )
    res = train_loop(spec, LocalStorage(root), utilization=BusyShare(), hooks=[hook]).to_dict()
    res.update(policy=policy, seed=seed, step_times_s=step_times)
    return res


def _supported(policy: str) -> bool:
    try:
        validate_policy(policy, "cpu")
    except PrecisionError:
        return False
    return True


def summarize(runs: Sequence[dict[str, Any]], arms: Sequence[str]) -> dict[str, Any]:
    """Paired-by-seed speedups and convergence of ``arms`` (fp32 first) in ``runs``.

    ``runs`` are dicts with policy, seed, train_time_s, wall_time_s, eval_loss and
    step_times_s. Flat keys, so the CLI prints them as one table.
    """
    by = {(r["policy"], r["seed"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    base = [by["fp32", s] for s in seeds]
    fp32_eval = [r["eval_loss"] for r in base]
    e = describe(fp32_eval)
    out: dict[str, Any] = {
        "seeds": len(seeds),
        "fp32_step_s_median": statistics.median(t for r in base for t in r["step_times_s"]),
        "fp32_eval_mean": e["mean"],
        "fp32_eval_std": e["std"],
    }
    for arm in arms:
        if arm == "fp32":
            continue
        cand = [by[arm, s] for s in seeds]
        pairs = list(zip(base, cand, strict=True))
        step = describe([b["train_time_s"] / c["train_time_s"] for b, c in pairs])
        wall = describe([b["wall_time_s"] / c["wall_time_s"] for b, c in pairs])
        # Medians of every step of every seed: insensitive to a stray slow step.
        median_step = statistics.median(t for r in cand for t in r["step_times_s"])
        delta = describe([c["eval_loss"] - b["eval_loss"] for b, c in pairs])
        out |= {
            f"step_speedup_{arm}": step["mean"],
            f"step_speedup_{arm}_std": step["std"],
            f"step_speedup_{arm}_ci95": f"[{step['ci95_low']:.3f}, {step['ci95_high']:.3f}]",
            f"median_step_speedup_{arm}": out["fp32_step_s_median"] / median_step,
            f"wall_speedup_{arm}": wall["mean"],
            f"wall_speedup_{arm}_std": wall["std"],
            f"eval_delta_{arm}": delta["mean"],  # signed, mean over seeds
            f"convergence_delta_{arm}": abs(delta["mean"]) / e["mean"],
            f"delta_{arm}_in_fp32_std": abs(delta["mean"]) / e["std"] if e["std"] else math.inf,
            f"delta_{arm}_within_3std": bool(abs(delta["mean"]) < 3 * e["std"]),
        }
    return out


def precision_comparison(
    steps: int,
    root: Path,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    model: str = "byte-lm",
    reference_steps: int | None = None,
    reference: ReferenceConfig | None = None,
    report: Report = print,
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """Run every arm once per seed, interleaved; return (lm summary, reference summary,
    raw runs). bf16 arms are left out where this CPU refuses bf16 (no AVX512-BF16/AMX)."""
    if len(seeds) < 2:
        raise ValueError("the comparison needs at least two seeds (a spread to compare with)")
    bf16 = _supported("bf16")
    lm_arms = [p for p in LM_POLICIES if p != "bf16" or bf16]
    ref_arms = [p for p in REF_POLICIES if p != "bf16" or bf16]
    arms = [("lm", p) for p in lm_arms] + [("ref", p) for p in ref_arms]
    ref_steps = steps if reference_steps is None else reference_steps
    runs: list[dict[str, Any]] = []
    for i, seed in enumerate(seeds):
        order = arms[i % len(arms) :] + arms[: i % len(arms)]
        for kind, policy in order:
            report(f"(b) seed {seed}: {kind} {policy}")
            if kind == "lm":
                run = _lm_run(policy, seed, model=model, steps=steps, root=root / "lm")
            else:
                run = train_reference(policy, steps=ref_steps, seed=seed, config=reference)
            run["arm"] = kind
            runs.append(run)
    lm_runs = [r for r in runs if r["arm"] == "lm"]
    lm = {"model": model, "steps": steps, **summarize(lm_runs, lm_arms)}
    auto_time = statistics.fmean(r["train_time_s"] for r in lm_runs if r["policy"] == "auto")
    best_fixed = min(
        statistics.fmean(r["train_time_s"] for r in lm_runs if r["policy"] == p)
        for p in lm_arms
        if p != "auto"
    )
    lm["auto_vs_best_fixed"] = best_fixed / auto_time  # goal >= 0.95
    auto_runs = [r for r in lm_runs if r["policy"] == "auto"]
    lm["auto_switches"] = [len(r["switches"]) for r in auto_runs]  # per seed
    # What auto's own A/B measured and chose, per seed: the evidence behind its dtype.
    lm["auto_ab"] = [
        f"seed {r['seed']}: {d['chosen']} ({d['candidate']} {d['speedup']:.2f}x over fp32, "
        f"steps {d['first_step']}-{d['last_step']})"
        for r in auto_runs
        for d in r.get("decisions", [])
    ]
    lm["order"] = "rotated per seed: " + ", ".join(f"{k}-{p}" for k, p in arms)
    lm["goal"] = (
        "step_speedup_bf16 and _auto >= 1.8, auto_vs_best_fixed >= 0.95, "
        "convergence_delta < 0.005 and within 3 fp32 std"
    )
    ref = {"model": "plain pre-norm block (DESIGN.md §5)", "steps": ref_steps}
    ref |= summarize([r for r in runs if r["arm"] == "ref"], ref_arms)
    raw = [{k: v for k, v in r.items() if k not in ("checkpoints",)} for r in runs]
    return lm, ref, raw
