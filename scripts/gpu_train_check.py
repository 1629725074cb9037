"""Train on this machine's NVIDIA GPUs as a gpuflow gang and say what it found: the NCCL check.

    .venv/bin/python scripts/gpu_train_check.py                # tables
    .venv/bin/python scripts/gpu_train_check.py --json         # one JSON summary on stdout
    .venv/bin/python scripts/gpu_train_check.py --steps 300 --gpus 2

It discovers the GPUs through NvmlBackend (as the inventory does: a unit per whole GPU,
named by its UUID), and runs the project's own gang launcher (run_gang: a torchelastic
agent, one rank per GPU, NCCL chosen from the units, each rank bound to its GPU by
CUDA_VISIBLE_DEVICES before CUDA starts) on a short job in four arms: DDP fp32, DDP bf16,
FSDP2 bf16 and ``auto`` (the run-time precision switch on the GPU's own evidence). Each
rank reports its workload through NVML (``device_backend=("nvml", None)``), as a job on
a real fleet does. Per arm: the backend the gang used, world size, steps, time inside
the steps, samples/s, final and eval loss, checkpoints committed, precision switches;
then bf16's and FSDP2's throughput over DDP fp32's, from the same run.

The job is byte-lm on the pydoc topics text (the project's offline data), the global
batch ``--batch`` split over the ranks. MIG mode is read, not changed: with MIG on, the
whole-GPU units would not be what a job leases, and the script says so and stops.

Exit status: 0 every arm trained on NCCL to finite losses and committed its last
checkpoint; 1 some arm failed (see "checks"); 2 no NVIDIA GPU (NVML unavailable, or no
device), with the reason.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.hardware.nvml import NvmlBackend
from gpuflow.tasks.training.distributed.gang import GangUnit
from gpuflow.tasks.training.distributed.launch import run_gang
from gpuflow.tasks.training.spec import TrainSpec

# (arm, parallel, precision): the reference first, so that every ratio has its baseline.
ARMS = (
    ("ddp-fp32", "ddp", "fp32"),
    ("ddp-bf16", "ddp", "bf16"),
    ("fsdp-bf16", "fsdp", "bf16"),
    ("ddp-auto", "ddp", "auto"),
)


def nvidia_units(gpus: int | None) -> tuple[list[GangUnit], dict[str, Any]]:
    """One gang unit per whole NVIDIA GPU NVML finds (the first ``gpus`` of them)."""
    with NvmlBackend() as b:
        [node] = b.discover()
        found = {"node": b.node, "driver_version": b.driver_version(), "devices": []}
        units = []
        for dev in node.devices:
            mig = b.mig_mode(node.name, dev.index) if "mig" in dev.partition_kinds else None
            found["devices"].append(
                {"index": dev.index, "sku": dev.sku, "uuid": dev.uuid, "mig_mode": mig}
            )
            if mig is not None and mig[0]:
                continue  # a MIG-enabled GPU is leased by its instances, not whole
            units.append(GangUnit(dev.uuid, node.name, dev.index, "nvidia"))
    return units[: gpus or len(units)], found


def run_arm(
    name: str, parallel: str, precision: str, units: list[GangUnit], args: Any, root: Path
) -> dict[str, Any]:
    spec = TrainSpec(
        job_id=f"gpu-check-{name}",
        model="byte-lm",
        steps=args.steps,
        batch_size=args.batch,
        precision=precision,
        parallel=parallel,
        gpus=len(units),
        checkpoint_interval=max(1, args.steps // 2),
        log_every=max(1, args.steps // 10),
        seed=0,
    )
    storage = CheckpointStorage(path=str(root / name / "ck"))
    out = run_gang(
        spec,
        storage,
        units,
        staging=root / name / "staging",
        device_backend=("nvml", None),
        threads_per_rank=2,
    )
    steps = int(out["steps_done"])
    train_s = float(out["train_time_s"])
    return {
        "arm": name,
        "parallel": parallel,
        "precision": precision,
        "backend": out.get("backend"),
        "world_size": out.get("world_size"),
        "steps": steps,
        "batch": spec.resolved_batch_size,
        "train_time_s": round(train_s, 3),
        "wall_time_s": round(float(out["wall_time_s"]), 3),
        "samples_per_s": round(steps * spec.resolved_batch_size / train_s, 1) if train_s else None,
        "final_loss": out["final_loss"],
        "eval_loss": out["eval_loss"],
        "checkpoints": len(out.get("checkpoints") or []),
        "last_checkpoint": out.get("last_checkpoint"),
        "switches": out.get("switches") or [],
        "skips": len(out.get("skips") or []),
    }


def arm_ok(row: dict[str, Any], steps: int) -> tuple[bool, str]:
    losses = [row["final_loss"], row["eval_loss"]]
    finite = all(v is not None and math.isfinite(v) for v in losses)
    ok = row["backend"] == "nccl" and row["steps"] == steps and finite and row["last_checkpoint"]
    return bool(ok), f"backend {row['backend']}, {row['steps']} steps, losses {losses}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON summary")
    ap.add_argument("--steps", type=int, default=200, help="steps per arm (default 200)")
    ap.add_argument("--batch", type=int, default=64, help="global batch (default 64)")
    ap.add_argument("--gpus", type=int, default=None, help="ranks (default: every GPU)")
    args = ap.parse_args(argv)

    ok, why = NvmlBackend.available()
    if not ok:
        if args.json:
            print(json.dumps({"available": False, "reason": why}))
        print(f"gpu_train_check: NVML unavailable: {why}", file=sys.stderr)
        return 2
    units, found = nvidia_units(args.gpus)
    summary: dict[str, Any] = {"available": True, **found, "ranks": len(units), "arms": []}
    if not units:
        print(f"gpu_train_check: no whole NVIDIA GPU to train on: {found}", file=sys.stderr)
        return 2
    checks = []
    with tempfile.TemporaryDirectory(prefix="gpu-train-check-") as tmp:
        for name, parallel, precision in ARMS:
            print(f"gpu_train_check: {name} on {len(units)} GPU(s) ...", file=sys.stderr)
            try:
                row = run_arm(name, parallel, precision, units, args, Path(tmp))
            except Exception as exc:  # one arm's failure is a finding, not the end
                row = {"arm": name, "error": f"{type(exc).__name__}: {exc}"}
                traceback.print_exc()
                checks.append({"check": name, "ok": False, "detail": row["error"]})
            else:
                good, detail = arm_ok(row, args.steps)
                checks.append({"check": name, "ok": good, "detail": detail})
            summary["arms"].append(row)
    base = next((r for r in summary["arms"] if r["arm"] == "ddp-fp32" and "error" not in r), None)
    for row in summary["arms"]:
        if base and row.get("samples_per_s") and base.get("samples_per_s"):
            row["throughput_vs_ddp_fp32"] = round(row["samples_per_s"] / base["samples_per_s"], 3)
    summary["checks"] = checks
    summary["ok"] = all(c["ok"] for c in checks)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        render_text(summary)
    return 0 if summary["ok"] else 1


def render_text(summary: dict[str, Any]) -> None:
    print(f"node {summary['node']}, driver {summary['driver_version']}, ranks {summary['ranks']}")
    for dev in summary["devices"]:
        print(f"  gpu{dev['index']}: {dev['sku']} {dev['uuid']} MIG {dev['mig_mode']}")
    cols = ("arm", "backend", "world_size", "steps", "train_time_s", "samples_per_s")
    cols += ("throughput_vs_ddp_fp32", "final_loss", "eval_loss", "checkpoints", "skips")
    print(" | ".join(cols))
    for row in summary["arms"]:
        if "error" in row:
            print(f"{row['arm']} | ERROR {row['error']}")
            continue
        print(" | ".join(str(row.get(c)) for c in cols))
        for switch in row["switches"]:
            print(f"    switch: {switch}")
    for c in summary["checks"]:
        print(f"[{'ok' if c['ok'] else 'FAIL'}] {c['check']}: {c['detail']}")


if __name__ == "__main__":
    sys.exit(main())
