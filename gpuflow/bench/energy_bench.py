"""`gpuflow bench energy`: the optimizer on every measured trace, and on the twin a real
training job at the maximum power limit against the same job with its limit chosen, side
by side in one run.

(a) traces: tasks.energy.evaluate on every summary_power_*.csv of ../shared/data/zeus-traces
    (Zeus, NSDI'23) at 10 % slowdown: capture of the oracle's saving (in total and per
    workload), probes against limits, bound violations, beside the seed rule and
    profile-everything;
(b) twin: the `train` flow on the twin's V100 (its curve is fitted to the V100 trace),
    arms interleaved over ``reps`` rounds, the order rotating: ``max`` (default limit,
    energy 'managed', no controller), ``tune`` (the in-training tuner probes in the first
    steps), ``dvfs`` (energy 'managed', with the `dvfs` flow - what the deployment runs -
    in a process of its own controlling the device meanwhile, every 5 s). Each arm's energy
    is the device's counter over the whole job, probes included; time is time per step over
    the whole job. Every job is an MLflow run under one parent run, with the tuner's plots;
    the controller records its own run (experiment gpuflow-energy) with its plots.
"""

from __future__ import annotations

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


def _arm(arm: str, steps: int, rep: int, parent: str) -> dict[str, Any]:
    from gpuflow.blocks.checkpoint_storage import CheckpointStorage
    from gpuflow.flows.train import train
    from gpuflow.hardware.home import gpuflow_home
    from gpuflow.tasks.training.binding import DeviceRequest
    from gpuflow.tasks.training.spec import TrainSpec

    spec = TrainSpec(
        job_id=f"bench-energy-{arm}-{rep}",
        model="llama-tiny",
        steps=steps,
        checkpoint_interval=steps,
        precision="fp32",
        energy="tune" if arm == "tune" else "managed",
    )
    out = train(
        spec,
        device=DeviceRequest(resource_id=_v100_uuid()),
        storage=CheckpointStorage(path=str(gpuflow_home() / "bench" / "energy-ckpt")),
        experiment=EXPERIMENT,
        parent_run_id=parent,
        log_model=False,
    )
    return {"arm": arm, "rep": rep, "run_id": out["run_id"], **out["energy"]}


def _v100_uuid() -> str:
    """Every arm on the same device: the twin's first V100 (its curve is the fitted one)."""
    from gpuflow.hardware.select import get_backend

    return next(d.uuid for d in get_backend("sim").devices() if "V100" in d.sku)


class Controller:
    """The `dvfs` flow (what the deployment runs) in a process of its own, for one job."""

    def __init__(self, duration_s: float) -> None:
        import subprocess
        import sys
        import tempfile

        self.log = tempfile.NamedTemporaryFile("w+", prefix="dvfs-", suffix=".log")  # noqa: SIM115
        code = (
            "import json, sys\n"
            "from gpuflow.flows.dvfs import dvfs_controller\n"
            "out = dvfs_controller(duration_s=float(sys.argv[1]), interval_s=5.0)\n"
            "print('DVFS-RESULT ' + json.dumps(out, default=str), flush=True)\n"
        )
        self.proc = subprocess.Popen(  # noqa: S603 - argv list built here, no shell
            [sys.executable, "-c", code, str(duration_s)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait_started(self, timeout_s: float = 180.0) -> None:
        """Until the flow run has begun (its first tick follows at once)."""
        import time

        deadline = time.monotonic() + timeout_s
        while "Beginning flow run" not in Path(self.log.name).read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the dvfs flow did not start: {self._tail()}")
            time.sleep(0.5)

    def result(self, timeout_s: float) -> dict[str, Any]:
        import json

        self.proc.wait(timeout=timeout_s)
        text = Path(self.log.name).read_text()
        line = next((ln for ln in text.splitlines() if ln.startswith("DVFS-RESULT ")), None)
        if self.proc.returncode != 0 or line is None:
            raise RuntimeError(f"the dvfs flow failed ({self.proc.returncode}): {self._tail()}")
        return json.loads(line.removeprefix("DVFS-RESULT "))

    def _tail(self) -> str:
        return Path(self.log.name).read_text()[-2000:]


def _dvfs_arm(steps: int, rep: int, parent: str, expected_s: float) -> dict[str, Any]:
    """The job, energy 'managed', with the dvfs flow controlling its device meanwhile."""
    controller = Controller(duration_s=expected_s * 1.5 + 20.0)
    controller.wait_started()
    row = _arm("dvfs", steps, rep, parent)
    out = controller.result(timeout_s=expected_s * 2 + 120.0)
    mine = [d for d in out.get("decisions", []) if d.get("job_id") == f"bench-energy-dvfs-{rep}"]
    row["controller_run_id"] = out.get("mlflow_run_id")
    row["controller_decisions"] = len(mine)
    if mine:
        row["controller_power_limit_w"] = mine[-1]["chosen"]["setting"]
        row["controller_decisions_w"] = [d["chosen"]["setting"] for d in mine]
        row["controller_noise"] = [d["noise"] for d in mine]
    return row


def _ci95(xs: list[float]) -> float:
    return 1.96 * statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan")


# The jobs' torch threads: one, so the host's other work (the dvfs arm's controller
# process, the Prefect servers) has a core of its own instead of stalling every op of a
# two-thread job on a two-core host (docs/energy.md: the controller's process competed
# only in the dvfs arm).
JOB_THREADS = 1


def twin_part(report: Report, seconds: float, reps: int) -> dict[str, Any]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(min(JOB_THREADS, threads))
    try:
        return _twin_part(report, seconds, reps)
    finally:
        torch.set_num_threads(threads)


def _twin_part(report: Report, seconds: float, reps: int) -> dict[str, Any]:
    import torch

    from gpuflow.tasks import tracking

    parent = tracking.open_run(
        EXPERIMENT,
        "bench-energy",
        params={"seconds_per_job": seconds, "reps": reps, "torch_threads": torch.get_num_threads()},
    )
    runs: list[dict[str, Any]] = []
    arms = ["max", "tune", "dvfs"]
    with tracking.fail_on_error(parent):
        report("twin: warm-up job (discarded: first-run costs would land in one arm)")
        warm = _arm("max", 300, -1, parent)
        steps = max(500, int(seconds / warm["time_per_step_s"]))
        for rep in range(reps):
            order = arms[rep % len(arms) :] + arms[: rep % len(arms)]  # rotates per round
            for arm in order:
                report(f"twin: {arm} round {rep + 1}/{reps} ({steps} steps)")
                if arm == "dvfs":
                    runs.append(_dvfs_arm(steps, rep, parent, seconds))
                else:
                    runs.append(_arm(arm, steps, rep, parent))
        base = {r["rep"]: r for r in runs if r["arm"] == "max"}
        summary: dict[str, Any] = {
            "steps": steps,
            "torch_threads": torch.get_num_threads(),
            "runs": runs,
        }
        for arm in arms[1:]:
            mine = [r for r in runs if r["arm"] == arm]
            saving = [1 - r["energy_j"] / base[r["rep"]]["energy_j"] for r in mine]
            slow = [r["time_per_step_s"] / base[r["rep"]]["time_per_step_s"] - 1 for r in mine]
            summary[arm] = {
                "energy_saving_mean": statistics.mean(saving),
                "energy_saving_ci95": _ci95(saving),
                "slowdown_mean": statistics.mean(slow),
                "slowdown_ci95": _ci95(slow),
                "energy_saving": saving,
                "slowdown": slow,
                "chosen_power_limit_w": [
                    r.get("tuned_power_limit_w", r.get("controller_power_limit_w")) for r in mine
                ],
            }
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
        "twin": twin_part(report, seconds=60.0 if quick else 120.0, reps=1 if quick else 3),
    }
