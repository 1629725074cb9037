"""`gpuflow bench distributed`: a gang of twin units (gloo, DDP, DCP) against one process.

All on this CPU, each rank on one twin unit with one thread; one spec and seed, fp32:
byte-lm (3.3M parameters, the train bench's model), global batch 12, 50 steps, a
checkpoint every 10 (``quick``: llama-tiny, 10 steps, every 5).

(a) Correctness: 2 ranks on global batch B against one process (train_loop, SINGLE) on B.
    The gang's per-step losses come from the gang itself: ``run_gang(record=True)`` makes
    rank 0 keep the global batch's loss after every step (a hook inside rank_main,
    tasks/training/distributed/worker.py); the one process keeps its own with a hook. Both
    runs' final weights are read back from their last checkpoints (trained_model). Goal:
    the same training up to the order of float sums (max abs differences ~1e-6).
(b) Cost: time per step inside the steps (TrainResult.train_time_s / steps; process
    start, checkpoints and eval left out) of 2 ranks x 1 thread against 1 process x 1
    thread on the same global batch. The all-reduce share of a rank's step is measured
    apart (allreduce_probe.py): two ranks alternate full DDP steps with and without
    ``no_sync()`` (what DDP's gradient all-reduce adds that backward does not hide) and
    time ``dist.all_reduce`` of a buffer of the gradients' size (the bare collective).
(c) Checkpoint stall: DcpCheckpointer.stalls_s of the 2-rank run (async_save for the
    periodic checkpoints, synchronous dcp.save for the last one; a 2-rank resume adds one
    more synchronous save of the same state): median async stall / median sync stall,
    goal <= 0.1. Per save the gang's stall is its slowest rank's (the next collective
    waits for it). Not in a stall: the wait for a previous async write before the next
    save (``flush``). Resharded resume: the 2-rank run's last periodic checkpoint resumed
    for one step on 1, 2 and 3 ranks, rank 0's time from train_loop's call to its first
    step, that step left out (build, fetch + verify, DCP load, DDP wrap; process start
    left out too), median of 3 resumes each, against resuming on 2.
(d) Mixed generations: 4 A100 + 4 V100 against 8 A100, each rank's step paced by its SKU's
    throughput (hardware/skus.py), a synchronous gang at its slowest member's pace
    (8 x min(rate)): a twin figure computed from the SKU tables (scheduler_bench's
    mixed_gang_cost), not a measurement, next to the seed document's "-37 %".

The run is also recorded in MLflow (experiment gpuflow-distributed) with a figure.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from gpuflow.bench.allreduce_probe import probe_allreduce
from gpuflow.bench.figures import flat_metrics
from gpuflow.bench.scheduler_bench import SEED_MIXED_LOSS, mixed_gang_cost
from gpuflow.bench.train_bench import machine
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.tasks.training.checkpoint import CheckpointManager
from gpuflow.tasks.training.distributed.gang import GangUnit
from gpuflow.tasks.training.distributed.launch import run_gang
from gpuflow.tasks.training.loop import StepInfo, train_loop, trained_model
from gpuflow.tasks.training.spec import TrainSpec
from gpuflow.tasks.training.storage import LocalStorage

Report = Callable[[str], None]
EXPERIMENT = "gpuflow-distributed"
JOB = "bench-gang"
GOAL_STALL_RATIO = 0.1
# One node of twin units; batch 12 splits into 1, 2 and 3 ranks.
UNITS = tuple(GangUnit(f"twin-{i}", "bench", i, "sim") for i in range(3))
BATCH = 12
RESUME_ON = (2, 1, 3)  # 2 first: the other two are compared with it


def bench_spec(model: str, steps: int, interval: int) -> TrainSpec:
    """fp32, so that the runs compare exactly; the model's own sequence length."""
    return TrainSpec(
        job_id=JOB,
        model=model,
        steps=steps,
        checkpoint_interval=interval,
        batch_size=BATCH,
        precision="fp32",
        seed=0,
        eval_batches=1,
    )


@contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _gang(spec: TrainSpec, root: Path, ranks: int) -> dict[str, Any]:
    storage = CheckpointStorage(path=str(root / "ck"))
    return run_gang(spec, storage, UNITS[:ranks], staging=root / "staging", record=True)


def _single(spec: TrainSpec, root: Path) -> tuple[dict[str, Any], list[float]]:
    losses: list[float] = []

    def keep(info: StepInfo) -> None:
        losses.append(info.loss)

    with _threads(1):  # as one rank has
        result = train_loop(spec, LocalStorage(root / "ck"), hooks=[keep])
    return result.to_dict(), losses


def _weights_difference(spec: TrainSpec, one: Path, other: Path) -> float:
    mine = trained_model(spec, LocalStorage(one / "ck")).state_dict()
    theirs = trained_model(spec, LocalStorage(other / "ck")).state_dict()
    return max(float((mine[k] - v).abs().max()) for k, v in theirs.items())


def _resume_on(source: Path, root: Path, spec: TrainSpec, ranks: int) -> dict[str, Any]:
    """``source``'s checkpoint before its last, resumed for one step on ``ranks`` ranks."""
    shutil.copytree(source / "ck", root / "ck")
    manager = CheckpointManager(LocalStorage(root / "ck"), JOB)
    (newest, _), (_, manifest) = manager.committed()[:2]
    shutil.rmtree(root / "ck" / JOB / newest)
    step = int(manifest["step"])
    out = _gang(spec.model_copy(update={"steps": step + 1}), root, ranks)
    if out["resumed_from_step"] != step:
        raise RuntimeError(f"resume on {ranks} rank(s) started at {out['resumed_from_step']}")
    return out


# -- the figures, from the runs' results (pure) ---------------------------------------------
def max_abs_difference(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        raise ValueError(f"loss curves differ in length: {len(a)} vs {len(b)} steps")
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def correctness(
    single: Mapping[str, Any],
    single_losses: Sequence[float],
    gang: Mapping[str, Any],
    weights_diff: float,
) -> dict[str, Any]:
    """(a) from one process's result and losses and the gang's rank-0 result."""
    return {
        "steps": single["steps_done"],
        "global_batch": BATCH,
        "loss_max_abs_diff": max_abs_difference(gang["losses"], single_losses),
        "final_weights_max_abs_diff": weights_diff,
        "final_loss_single": single["final_loss"],
        "final_loss_gang": gang["final_loss"],
        "losses_from": "rank 0's per-step hook inside rank_main (run_gang record=True)",
    }


def cost(
    single: Mapping[str, Any], gang: Mapping[str, Any], probe: Mapping[str, Any]
) -> dict[str, Any]:
    """(b): time per step inside the steps, and the probe's all-reduce share."""
    single_step = single["train_time_s"] / single["steps_done"]
    gang_step = gang["train_time_s"] / gang["steps_done"]
    return {
        "single_step_s": single_step,
        "gang_step_s": gang_step,
        "gang_vs_single_step": gang_step / single_step,
        "ideal_gang_vs_single_step": 1 / gang["world_size"],
        **probe,
        "allreduce_share_of_gang_step": probe["ddp_allreduce_exposed_s"] / gang_step,
    }


def gang_stalls(ranks: Sequence[Mapping[str, Any]]) -> list[float]:
    """Per save, the slowest rank's stall (every rank saves at the same steps)."""
    per_rank = (r["checkpoint_stalls_s"] for r in ranks)
    return [max(per_save) for per_save in zip(*per_rank, strict=True)]


def checkpoint_stall(
    gang: Mapping[str, Any], resumed: Mapping[int, Sequence[Mapping[str, Any]]]
) -> dict[str, Any]:
    """(c) from the 2-rank run (its periodic saves async, its last sync) and its resumes
    (``resumed[ranks]``: repeated runs of one step each, whose only save is a sync one);
    the resumes' times are medians over the repeats."""
    stalls = gang_stalls(gang["ranks"])
    sync_s = stalls[-1:] + [s for r in resumed[2] for s in gang_stalls(r["ranks"])]
    async_s = stalls[:-1]
    if not async_s:
        raise ValueError("the 2-rank run made no periodic (async) checkpoint")
    a, s = statistics.median(async_s), statistics.median(sync_s)
    out: dict[str, Any] = {
        "async_saves": len(async_s),
        "sync_saves": len(sync_s),
        "async_stall_median_s": a,
        "sync_stall_median_s": s,
        "stall_ratio": a / s,
        "goal_ratio": GOAL_STALL_RATIO,
        "meets_goal": a / s <= GOAL_STALL_RATIO,
        "stalls_s": async_s + sync_s,
        "fresh_start_to_first_step_s": gang["to_first_step_s"],
    }
    first_step = {
        n: statistics.median(r["to_first_step_s"] for r in runs) for n, runs in resumed.items()
    }
    on_2 = first_step[2]
    out["resume_repeats"] = len(resumed[2])
    out["restore_on_2_s"] = on_2 - gang["to_first_step_s"]  # the same start, plus a restore
    for ranks, seconds in sorted(first_step.items()):
        out[f"resume_2_on_{ranks}_to_first_step_s"] = seconds
        out[f"resume_2_on_{ranks}_vs_on_2"] = seconds / on_2
    return out


def mixed_generations() -> dict[str, Any]:
    """(d): 4 A100 + 4 V100 against 8 A100, from the twin's SKU tables (not measured)."""
    table = mixed_gang_cost()
    out: dict[str, Any] = {"kind": "twin figure computed from the SKU tables (hardware/skus.py)"}
    for precision in ("fp32", "fp16"):
        vs_all = table[f"{precision}_4a100+4v100_vs_all_a100"]
        out[f"{precision}_throughput_vs_8xa100"] = vs_all
        out[f"{precision}_change_vs_8xa100"] = round(vs_all - 1, 4)
        out[f"{precision}_loss_vs_members_sum"] = table[f"{precision}_4a100+4v100_loss"]
    out["seed_claim_change"] = -SEED_MIXED_LOSS
    return out


def goals(out: Mapping[str, Any]) -> dict[str, Any]:
    """The headline figures of ``run``'s sections, next to their goals."""
    mixed = out["mixed_generations"]
    return {
        "loss_max_abs_diff": out["correctness"]["loss_max_abs_diff"],
        "final_weights_max_abs_diff": out["correctness"]["final_weights_max_abs_diff"],
        "gang_vs_single_step": out["cost"]["gang_vs_single_step"],
        "allreduce_share_of_gang_step": out["cost"]["allreduce_share_of_gang_step"],
        "stall_ratio": out["checkpoint"]["stall_ratio"],
        "stall_goal": GOAL_STALL_RATIO,
        "stall_goal_met": out["checkpoint"]["meets_goal"],
        "mixed_fp32_change_vs_8xa100": mixed["fp32_change_vs_8xa100"],
        "mixed_fp16_change_vs_8xa100": mixed["fp16_change_vs_8xa100"],
        "seed_claim_change": mixed["seed_claim_change"],
    }


def _record(out: Mapping[str, Any], single: Sequence[float], gang: Sequence[float]) -> str:
    """The run as an MLflow run: its figures as metrics, loss curves and stalls as a figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import mlflow

    from gpuflow.tasks.tracking import use_experiment

    experiment_id = use_experiment(EXPERIMENT)
    with mlflow.start_run(experiment_id=experiment_id, run_name="bench-distributed") as run:
        mlflow.log_metrics(flat_metrics(out))
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
        left.plot(range(1, len(single) + 1), single, label="1 process")
        left.plot(range(1, len(gang) + 1), gang, "--", label="2 ranks")
        left.set(xlabel="step", ylabel="loss", title=f"per-step loss, global batch {BATCH}")
        left.legend()
        stalls = out["checkpoint"]["stalls_s"]
        right.bar(range(len(stalls)), stalls, color="#4c72b0")
        right.set(xlabel="save", ylabel="stall (s)", title="checkpoint stalls (async, then sync)")
        fig.tight_layout()
        mlflow.log_figure(fig, "distributed.png")
        plt.close(fig)
        return run.info.run_id


def run(quick: bool = False, report: Report = print) -> dict[str, Any]:
    """(a)-(d). ``quick``: llama-tiny for 10 steps instead of byte-lm for 50, each resume
    once instead of three times (what is left is mostly process start; its figures mean
    little)."""
    started = time.perf_counter()
    model, steps, interval, probe_steps, repeats = (
        ("llama-tiny", 10, 5, 5, 1) if quick else ("byte-lm", 50, 10, 20, 3)
    )
    spec = bench_spec(model, steps, interval)
    out: dict[str, Any] = {"machine": machine() | {"backend": "gloo", "model": model}}
    out["quick"] = quick
    with tempfile.TemporaryDirectory(prefix="gpuflow-bench-distributed-") as tmp:
        root = Path(tmp)
        report(f"(a, b) one process x 1 thread, {model}, {steps} steps")
        single, single_losses = _single(spec, root / "single")
        report(f"(a, b) 2 ranks x 1 thread, {model}, {steps} steps")
        gang = _gang(spec, root / "gang", 2)
        weights_diff = _weights_difference(spec, root / "single", root / "gang")
        out["correctness"] = correctness(single, single_losses, gang, weights_diff)
        report("(b) DDP steps with and without no_sync, and a bare all-reduce")
        probe = probe_allreduce(spec, 2, probe_steps, root / "probe")
        out["cost"] = cost(single, gang, probe)
        resumed: dict[int, list[dict[str, Any]]] = {ranks: [] for ranks in RESUME_ON}
        for repeat in range(repeats):  # round-robin: every rank count sees the same noise
            for ranks in RESUME_ON:
                report(
                    f"(c) a 2-rank checkpoint resumed on {ranks} rank(s), {repeat + 1}/{repeats}"
                )
                folder = root / f"resume-{ranks}-{repeat}"
                resumed[ranks].append(_resume_on(root / "gang", folder, spec, ranks))
        out["checkpoint"] = checkpoint_stall(gang, resumed)
    out["mixed_generations"] = mixed_generations()
    out["goals"] = goals(out) | {"quick": quick, "wall_s": round(time.perf_counter() - started, 1)}
    try:
        out["goals"]["mlflow_run_id"] = _record(out, single_losses, gang["losses"])
    except Exception as exc:  # noqa: BLE001 - the figures are the result; a store problem must not lose them
        out["goals"]["mlflow_run_id"] = f"not recorded: {exc}"
    return out
