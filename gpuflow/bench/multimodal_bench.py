"""`gpuflow bench multimodal`: the branch layout against one device, side by side.

Every arm is a real job of the `train_multimodal` flow's launcher (run_ranks: one
torchelastic agent, one process per rank, gloo) on twin units of one node, on this CPU.

(a) Throughput: samples/s on the same global batch (64) and seed, rank 0's steady steps
    (the first step left out), of
      single-1t   one rank, one thread: the one-device reference;
      single-2t   one rank, two threads: one process given every core of this machine;
      branch      three ranks of one thread (head, vision, text): the seed's §4.1 layout;
      branch-2    two ranks (vision+head, text).
    The arms run interleaved, the order rotated each round; ratios are per round, reported
    as a mean with a 95 % t interval over the rounds. The bound overlapping can reach is
    computed from single-1t's own per-part compute times: (vision + text + head) /
    (max(vision, text) + head).
(b) Memory per device: each rank's parameters, gradients and Adam state plus the peak of
    what autograd keeps for the backward pass (memory.py), with and without gradient
    checkpointing of the vision tower, in the branch layout; the single device's total.
(c) Quality: the same job trained in the single layout with an fp32 and with an int8
    text tower (clip-tiny, more steps), zero-shot accuracy and recall@1/5 on the held-out
    split beside the untrained model and chance.
(d) The seed's claim (2.3x training throughput for the CLIP pipeline), with the verdict.

On two cores the towers can compute at the same time only as two processes of one thread
each: (a) shows what overlapping the branches buys when the branches are the only work,
not what a GPU per tower buys (no device-to-device path, no NCCL; the head's rank shares
the cores). The run is recorded in MLflow (experiment gpuflow-multimodal) with a figure.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuflow.bench.figures import ci95, flat_metrics
from gpuflow.bench.train_bench import machine
from gpuflow.tasks.multimodal.checkpoint import load_model
from gpuflow.tasks.multimodal.data import CaptionedDigits
from gpuflow.tasks.multimodal.job import run_ranks
from gpuflow.tasks.multimodal.loop import model_config
from gpuflow.tasks.multimodal.model import ClipModel
from gpuflow.tasks.multimodal.quality import evaluate
from gpuflow.tasks.multimodal.recording import EXPERIMENT, QUALITY_KEYS
from gpuflow.tasks.multimodal.spec import MultimodalSpec
from gpuflow.tasks.training.checkpoint import CheckpointManager
from gpuflow.tasks.training.distributed.gang import GangUnit
from gpuflow.tasks.training.storage import LocalStorage

Report = Callable[[str], None]
UNITS = tuple(GangUnit(f"twin-{i}", "bench", i, "sim") for i in range(3))
SEED_CLAIM_SPEEDUP = 2.3
BATCH = 64
# name -> (layout, head, threads per rank)
ARMS: dict[str, tuple[str, str, int]] = {
    "single-1t": ("single", "separate", 1),
    "single-2t": ("single", "separate", 2),
    "branch": ("branch", "separate", 1),
    "branch-2": ("branch", "vision", 1),
}
_MB = 1e6


def _arm_spec(size: str, steps: int, arm: str, job_id: str, **fields: Any) -> MultimodalSpec:
    layout, head, threads = ARMS[arm]
    return MultimodalSpec(
        job_id=job_id,
        size=size,
        layout=layout,
        head=head,
        threads_per_rank=threads,
        steps=steps,
        batch_size=BATCH,
        checkpoint_interval=steps,
        workers=1,
        **fields,
    )


def _run(spec: MultimodalSpec, root: Path) -> dict[int, dict[str, Any]]:
    units = UNITS[: spec.resolved_layout.world_size]
    return run_ranks(spec, LocalStorage(root / spec.job_id), units)


def throughput(size: str, steps: int, rounds: int, root: Path, report: Report) -> dict[str, Any]:
    """(a): every arm once per round, the order rotated; per-round ratios to single-1t."""
    names = list(ARMS)
    rates: dict[str, list[float]] = {n: [] for n in names}
    parts: dict[str, list[float]] = {}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            report(f"(a) {size}, round {r + 1}/{rounds}: {name}")
            ranks = _run(_arm_spec(size, steps, name, f"tp-{name}-{r}"), root)
            rates[name].append(ranks[0]["samples_per_s"])
            if name == "single-1t":  # one device's own time per part
                for part, seconds in ranks[0]["compute_s_by_part"].items():
                    parts.setdefault(part, []).append(seconds)
    out: dict[str, Any] = {"size": size, "steps": steps, "rounds": rounds, "batch": BATCH}
    for name in names:
        out[f"{name}.samples_per_s"] = statistics.mean(rates[name])
        out[f"{name}.samples_per_s_ci95"] = ci95(rates[name])
        if name != "single-1t":
            ratios = [a / b for a, b in zip(rates[name], rates["single-1t"], strict=True)]
            out[f"{name}.speedup"] = statistics.mean(ratios)
            out[f"{name}.speedup_ci95"] = ci95(ratios)
    out.update({f"compute_s.{p}": statistics.mean(t) for p, t in parts.items()})
    out["overlap_bound"] = overlap_bound({p: statistics.mean(t) for p, t in parts.items()})
    return out


def overlap_bound(parts: dict[str, float]) -> float:
    """What overlapping the towers can at best give: all the work over the longer branch
    (the head runs after both; on its own rank it adds to the critical path)."""
    total = parts["vision"] + parts["text"] + parts["head"]
    return total / (max(parts["vision"], parts["text"]) + parts["head"])


def memory(size: str, steps: int, root: Path, report: Report) -> dict[str, Any]:
    """(b): per-rank memory, branch layout, checkpointing off and on; the single total."""
    out: dict[str, Any] = {"size": size}
    for checkpointing in (False, True):
        tag = "ckpt" if checkpointing else "plain"
        report(f"(b) memory per device, gradient checkpointing {'on' if checkpointing else 'off'}")
        spec = _arm_spec(size, steps, "branch", f"mem-{tag}", checkpointing=checkpointing)
        for result in _run(spec, root).values():
            mem = result["memory"]
            role = result["role"]
            out[f"{tag}.{role}.state_mb"] = mem["state_bytes"] / _MB
            out[f"{tag}.{role}.activation_peak_mb"] = mem["activation_peak_bytes"] / _MB
            out[f"{tag}.{role}.device_mb"] = (
                mem["state_bytes"] + mem["activation_peak_bytes"]
            ) / _MB
    report("(b) memory of one device holding every part")
    [single] = _run(_arm_spec(size, steps, "single-1t", "mem-single"), root).values()
    mem = single["memory"]
    out["single.device_mb"] = (mem["state_bytes"] + mem["activation_peak_bytes"]) / _MB
    out["branch.max_device_mb"] = max(
        v for k, v in out.items() if k.startswith("plain.") and k.endswith(".device_mb")
    )
    out["vision_activation_saving"] = 1 - (
        out["ckpt.vision.activation_peak_mb"] / out["plain.vision.activation_peak_mb"]
    )
    return out


def quality(steps: int, root: Path, report: Report) -> dict[str, Any]:
    """(c): clip-tiny with the fp32 and the int8 text tower, same seed and steps."""
    out: dict[str, Any] = {"size": "clip-tiny", "steps": steps}
    for text_int8 in (False, True):
        tag = "int8" if text_int8 else "fp32"
        report(f"(c) quality, {tag} text tower, {steps} steps")
        spec = _arm_spec("clip-tiny", steps, "single-2t", f"q-{tag}", text_int8=text_int8)
        _run(spec, root)
        config = model_config(spec)
        manager = CheckpointManager(
            LocalStorage(root / spec.job_id),
            spec.job_id,
            expected_model=config.fingerprint(text_int8),
        )
        loaded = load_model(manager, config, text_int8)
        assert loaded is not None  # the run ends with a checkpoint
        held_out = CaptionedDigits("test", image_size=config.image_size)
        figures = evaluate(loaded[0], held_out)
        if not text_int8:
            untrained = evaluate(ClipModel.build(config, spec.seed), held_out)
            out.update({f"untrained.{k}": untrained[k] for k in QUALITY_KEYS})
            out.update({f"chance.{k}": figures[f"{k}_chance"] for k in QUALITY_KEYS})
        out.update({f"{tag}.{k}": figures[k] for k in QUALITY_KEYS})
    return out


def seed_claim(tp: dict[str, Any]) -> dict[str, Any]:
    speedup = tp["branch.speedup"]
    return {
        "claim_speedup": SEED_CLAIM_SPEEDUP,
        "measured_branch_speedup": speedup,
        "measured_ci95": tp["branch.speedup_ci95"],
        "overlap_bound": tp["overlap_bound"],
        "verdict": (
            "not reproduced"
            if speedup + tp["branch.speedup_ci95"] < SEED_CLAIM_SPEEDUP
            else "reproduced"
        ),
    }


def _record(out: dict[str, Any]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import mlflow

    from gpuflow.tasks.tracking import use_experiment

    experiment_id = use_experiment(EXPERIMENT)
    with mlflow.start_run(experiment_id=experiment_id, run_name="bench-multimodal") as run:
        mlflow.log_metrics(flat_metrics(out))
        tp, mem = out["throughput"], out["memory"]
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
        names = list(ARMS)
        left.bar(
            names,
            [tp[f"{n}.samples_per_s"] for n in names],
            yerr=[tp[f"{n}.samples_per_s_ci95"] for n in names],
            color="#4c72b0",
        )
        left.set(ylabel="samples/s", title=f"{tp['size']}, global batch {BATCH}")
        roles = ["head", "vision", "text"]
        for i, tag in enumerate(("plain", "ckpt")):
            right.bar(
                [j + i * 0.4 for j in range(3)],
                [mem[f"{tag}.{r}.device_mb"] for r in roles],
                0.4,
                label="checkpointing" if tag == "ckpt" else "no checkpointing",
            )
        right.axhline(mem["single.device_mb"], color="k", ls="--", label="one device")
        right.set_xticks([j + 0.2 for j in range(3)], roles)
        right.set(ylabel="MB (state + activations)", title="memory per device, branch layout")
        right.legend()
        fig.tight_layout()
        mlflow.log_figure(fig, "multimodal-bench.png")
        plt.close(fig)
        return run.info.run_id


def run(quick: bool = False, report: Report = print) -> dict[str, Any]:
    """(a)-(d). ``quick``: clip-tiny, few steps, one round (the figures mean little)."""
    started = time.perf_counter()
    size, steps, rounds, quality_steps = (
        ("clip-tiny", 6, 1, 20) if quick else ("clip-small", 30, 3, 300)
    )
    out: dict[str, Any] = {"machine": machine() | {"backend": "gloo", "device": "cpu (twin)"}}
    with tempfile.TemporaryDirectory(prefix="gpuflow-bench-multimodal-") as tmp:
        root = Path(tmp)
        tp = out["throughput"] = throughput(size, steps, rounds, root, report)
        out["memory"] = memory(size, max(steps // 3, 3), root / "memory", report)
        out["quality"] = quality(quality_steps, root / "quality", report)
    out["seed_claim"] = seed_claim(tp)
    out["seed_claim"]["quick"] = quick
    out["seed_claim"]["wall_s"] = round(time.perf_counter() - started, 1)
    try:
        out["seed_claim"]["mlflow_run_id"] = _record(out)
    except Exception as exc:  # noqa: BLE001 - the figures are the result; a store problem must not lose them
        out["seed_claim"]["mlflow_run_id"] = f"not recorded: {exc}"
    return out
