"""`gpuflow bench energy`: the optimizer on every measured trace, and on the twin a real
training job at the maximum power limit against the same job with its limit chosen, side
by side in one run.

(a) traces: tasks.energy.evaluate on every summary_power_*.csv of ../shared/data/zeus-traces
    (Zeus, NSDI'23) at 10 % slowdown: capture of the oracle's saving (in total and per
    workload), probes against limits, bound violations, beside the seed rule and
    profile-everything;
(b) twin: the `train` flow (llama-tiny, fp32) on two of the twin's V100s (their curve is
    fitted to the V100 trace) at once, per round and per arm: ``max-<arm>`` (pinned at the
    highest limit: its settings row keeps the controller off its device) beside ``<arm>``:
    ``dvfs`` (energy 'managed', with the `dvfs` flow - what the deployment runs - in a
    process of its own, every 5 s) or ``tune`` (the in-training tuner). Each job is a
    process of its own, one torch thread pinned to a core of its own; devices and cores
    change sides every round. A step's time on the twin is the device's (tasks.training.
    pacing: max(host busy, 2 x the 10th percentile of host busy x T(f)/T(f_max))), so the
    host's jitter does not swamp the power limit's effect. Each arm's energy is the
    device's counter over the whole job, probes included; time is time per step over the
    whole job. Every job is an MLflow run under one parent run, with the tuner's plots; the
    controller records its own run (experiment gpuflow-energy) with its plots.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuflow.bench.train_bench import machine
from gpuflow.tasks.energy.traces import DEFAULT_TRACES_DIR

Report = Callable[[str], None]
TRACES = DEFAULT_TRACES_DIR
EXPERIMENT = "gpuflow-bench-energy"


def trace_files() -> list[Path]:
    return sorted(TRACES.glob("summary_power_*.csv"))


def traces_part(report: Report, slowdown: float = 0.10) -> dict[str, Any]:
    from gpuflow.tasks.energy.evaluate import evaluate_trace, summarise
    from gpuflow.tasks.energy.optimizer import Objective

    out: dict[str, Any] = {}
    for path in trace_files():
        report(f"replaying {path.name}")
        rows = evaluate_trace(path, Objective(slowdown=slowdown))
        out[path.stem.removeprefix("summary_power_")] = {
            s.method: s.to_dict() for s in summarise(rows)
        }
    return out


def _arm(
    arm: str, steps: int, rep: int, parent: str, device_uuid: str, max_limit_w: float | None
) -> dict[str, Any]:
    """One job of ``arm`` on the device ``device_uuid``: ``max...`` pinned at ``max_limit_w``
    (its settings row keeps a running controller off the device), ``tune`` with the
    in-training tuner, anything else energy 'managed' (the controller's to set). Checkpoints
    go under the bench's parent run, so no job resumes one of an earlier bench run."""
    from gpuflow.blocks.checkpoint_storage import CheckpointStorage
    from gpuflow.flows.train import train
    from gpuflow.hardware.home import gpuflow_home
    from gpuflow.tasks.training.binding import DeviceRequest
    from gpuflow.tasks.training.spec import TrainSpec

    energy = "pinned" if arm.startswith("max") else "tune" if arm == "tune" else "managed"
    spec = TrainSpec(
        job_id=f"bench-energy-{arm}-{rep}",
        model="llama-tiny",
        steps=steps,
        checkpoint_interval=steps,
        precision="fp32",
        energy=energy,
        power_limit_w=max_limit_w if energy == "pinned" else None,
    )
    out = train(
        spec,
        device=DeviceRequest(resource_id=device_uuid),
        storage=CheckpointStorage(path=str(gpuflow_home() / "bench" / "energy-ckpt" / parent)),
        experiment=EXPERIMENT,
        parent_run_id=parent,
        log_model=False,
    )
    return {"arm": arm, "rep": rep, "device": device_uuid, "run_id": out["run_id"], **out["energy"]}


def _v100s() -> list[tuple[str, float]]:
    """The twin's V100s (their curve is the fitted one): (uuid, highest power limit in W)."""
    from gpuflow.hardware.select import get_backend

    backend = get_backend("sim")
    return [
        (d.uuid, backend.power_limits(d.node, d.index).max_limit_mw / 1000.0)
        for d in backend.devices()
        if "V100" in d.sku
    ]


class _Child:
    """A Python child process whose result is one marked JSON line of its output."""

    MARK = "RESULT "

    def __init__(self, code: str, *args: str) -> None:
        import subprocess
        import sys
        import tempfile

        self.log = tempfile.NamedTemporaryFile("w+", prefix="bench-energy-", suffix=".log")  # noqa: SIM115
        from gpuflow.tasks.training.pacing import PAD, PAD_ENV

        self.proc = subprocess.Popen(  # noqa: S603 - argv list built here, no shell
            [sys.executable, "-c", code, *args],
            # Every step padded (tasks.training.pacing), so a limit's few per cent show.
            env={**os.environ, PAD_ENV: str(PAD)},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def result(self, timeout_s: float) -> dict[str, Any]:
        import json

        self.proc.wait(timeout=timeout_s)
        text = Path(self.log.name).read_text()
        line = next((ln for ln in text.splitlines() if ln.startswith(self.MARK)), None)
        if self.proc.returncode != 0 or line is None:
            raise RuntimeError(
                f"{self.MARK.strip()} missing ({self.proc.returncode}): {self._tail()}"
            )
        return json.loads(line.removeprefix(self.MARK))

    def _tail(self) -> str:
        return Path(self.log.name).read_text()[-2000:]


# One job per process, its torch on one thread pinned to one core (the host's other work -
# the other arm, the controller, the Prefect servers - does not stall its ops; docs/energy.md).
_ARM_CODE = (
    "import json, os, sys\n"
    "core = int(sys.argv[1])\n"
    "if core >= 0:\n"
    "    os.sched_setaffinity(0, {core})\n"
    "import torch\n"
    "torch.set_num_threads(1)\n"
    "from gpuflow.bench.energy_bench import _arm\n"
    "limit = float(sys.argv[7]) if sys.argv[7] else None\n"
    "row = _arm(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], limit)\n"
    "print('RESULT ' + json.dumps(row, default=str), flush=True)\n"
)


class ArmProcess(_Child):
    """One arm's job in a process of its own, pinned to ``core`` (-1: not pinned)."""

    def __init__(
        self, arm: str, steps: int, rep: int, parent: str, device: tuple[str, float], core: int
    ) -> None:
        uuid, max_w = device
        limit = f"{max_w:g}" if arm.startswith("max") else ""
        super().__init__(_ARM_CODE, str(core), arm, str(steps), str(rep), parent, uuid, limit)


class Controller(_Child):
    """The `dvfs` flow (what the deployment runs) in a process of its own, for one round."""

    MARK = "DVFS-RESULT "

    def __init__(self, duration_s: float) -> None:
        code = (
            "import json, sys\n"
            "from gpuflow.flows.dvfs import dvfs_controller\n"
            "out = dvfs_controller(duration_s=float(sys.argv[1]), interval_s=5.0)\n"
            "print('DVFS-RESULT ' + json.dumps(out, default=str), flush=True)\n"
        )
        super().__init__(code, str(duration_s))

    def wait_started(self, timeout_s: float = 180.0) -> None:
        """Until the flow run has begun (its first tick follows at once)."""
        import time

        deadline = time.monotonic() + timeout_s
        while "Beginning flow run" not in Path(self.log.name).read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the dvfs flow did not start: {self._tail()}")
            time.sleep(0.5)

    def decisions_for(self, row: dict[str, Any], timeout_s: float) -> None:
        """Wait for the flow's end and add its decisions on ``row``'s job to ``row``."""
        out = self.result(timeout_s)
        job = f"bench-energy-{row['arm']}-{row['rep']}"
        mine = [d for d in out.get("decisions", []) if d.get("job_id") == job]
        row["controller_run_id"] = out.get("mlflow_run_id")
        row["controller_decisions"] = len(mine)
        if mine:
            row["controller_power_limit_w"] = mine[-1]["chosen"]["setting"]
            row["controller_decisions_w"] = [d["chosen"]["setting"] for d in mine]
            row["controller_noise"] = [d["noise"] for d in mine]


def _ci95(xs: list[float]) -> float:
    return 1.96 * statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan")


def _cores() -> list[int]:
    """Two cores to pin the two arms of a pair to; [-1, -1] (no pinning) on one core."""
    import os

    cores = sorted(os.sched_getaffinity(0))
    return cores[:2] if len(cores) >= 2 else [-1, -1]


def _pair(
    arm: str, steps: int, rep: int, parent: str, seconds: float, swap: bool
) -> list[dict[str, Any]]:
    """``max`` and ``arm`` at once, each on a V100 and a core of its own (swapped when
    ``swap``: the devices and cores change sides every round)."""
    devices, cores = _v100s()[:2], _cores()
    if swap:
        devices, cores = devices[::-1], cores[::-1]
    controller = None
    if arm == "dvfs":
        # Past the job's end (its process and Prefect start take ~30-40 s); should the job
        # outlast it, the controller puts the maximum back and the rest runs there.
        controller = Controller(duration_s=seconds * 1.15 + 60.0)
        controller.wait_started()
    procs = [
        ArmProcess(a, steps, rep, parent, dev, core)
        for a, dev, core in zip((f"max-{arm}", arm), devices, cores, strict=True)
    ]
    rows = [p.result(timeout_s=seconds * 3 + 300.0) for p in procs]
    if controller is not None:
        controller.decisions_for(rows[1], timeout_s=seconds * 2 + 180.0)
    return rows


def _summary(runs: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    """``arm`` against the ``max`` job that ran beside it, per round, and over the rounds."""
    base = {r["rep"]: r for r in runs if r["arm"] == f"max-{arm}"}
    mine = [r for r in runs if r["arm"] == arm]
    saving = [1 - r["energy_j"] / base[r["rep"]]["energy_j"] for r in mine]
    slow = [r["time_per_step_s"] / base[r["rep"]]["time_per_step_s"] - 1 for r in mine]
    return {
        "energy_saving_mean": statistics.mean(saving),
        "energy_saving_ci95": _ci95(saving),
        "slowdown_mean": statistics.mean(slow),
        "slowdown_ci95": _ci95(slow),
        "energy_saving": saving,
        "slowdown": slow,
        "max_energy_j": [base[r["rep"]]["energy_j"] for r in mine],
        "max_time_per_step_s": [base[r["rep"]]["time_per_step_s"] for r in mine],
        "energy_j": [r["energy_j"] for r in mine],
        "time_per_step_s": [r["time_per_step_s"] for r in mine],
        "chosen_power_limit_w": [
            r.get("tuned_power_limit_w", r.get("controller_power_limit_w")) for r in mine
        ],
    }


def twin_part(
    report: Report, seconds: float, reps: int, arms: tuple[str, ...] = ("dvfs", "tune")
) -> dict[str, Any]:
    """Per round and per arm, ``max`` and the arm side by side (two V100s, two cores)."""
    from gpuflow.tasks import tracking

    parent = tracking.open_run(
        EXPERIMENT,
        "bench-energy",
        params={"seconds_per_job": seconds, "reps": reps, "torch_threads": 1, "side_by_side": 1},
    )
    runs: list[dict[str, Any]] = []
    with tracking.fail_on_error(parent):
        report("twin: warm-up job (discarded: first-run costs would land in one arm)")
        dev, core = _v100s()[0], _cores()[0]
        warm = ArmProcess("max-warm", 300, -1, parent, dev, core).result(timeout_s=600.0)
        steps = max(500, int(seconds / warm["time_per_step_s"]))
        for rep in range(reps):
            for arm in arms:
                report(f"twin: max beside {arm}, round {rep + 1}/{reps} ({steps} steps)")
                base, row = _pair(arm, steps, rep, parent, seconds, swap=rep % 2 == 1)
                runs += [base, row]
        summary: dict[str, Any] = {"steps": steps, "torch_threads": 1, "runs": runs}
        for arm in arms:
            summary[arm] = _summary(runs, arm)
            tracking.log_metrics(
                parent,
                {
                    f"{arm}_energy_saving": summary[arm]["energy_saving_mean"],
                    f"{arm}_slowdown": summary[arm]["slowdown_mean"],
                },
            )
        tracking.close_run(parent)
    summary["parent_run_id"] = parent
    return summary


def run(quick: bool = False, report: Report = print) -> dict[str, Any]:
    return {
        "machine": machine(),
        "traces": traces_part(report),
        # 180 s a job: the controller's warm-up (30 s) and search (~50 s) leave the choice
        # most of the job, so the whole-job figures show what it chose.
        "twin": twin_part(report, seconds=60.0 if quick else 180.0, reps=1 if quick else 3),
    }
