"""`gpuflow demo`: the tour on the digital twin, one step per capability.

discover and partition the fleet (fleet.py) -> compare precision (precision.py) -> train
the health champion (health.py) -> a predicted fault and its remediation, decided by that
champion (remediation.py) -> edge slicing (edge.py) -> what it measured and where to look
(summary.py). It runs in a GPUFLOW_HOME of its own and records where `gpuflow up` serves
from (record.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.tour.fleet import tour_plan_path

__all__ = ["TourSize", "run_demo", "tour_plan_path"]


@dataclass(frozen=True)
class TourSize:
    """How much work each step does; the default is the tour, ``quick()`` a smoke run."""

    compare_steps: int = 40  # optimizer steps of each compare_precision run
    compare_batch_size: int = 16  # sequences per step of each compare_precision run
    remediation_steps: int = 300  # steps of the job that is moved off the failing GPU
    edge_requests: int = 20  # requests measured through the edge shard chain
    # The health champion trained on the production fleet at its real fault rate (about
    # 1.5 min) or on the small raised-hazard one (tour/health.py says why it matters).
    health_real_rate: bool = True

    def __post_init__(self) -> None:
        # The remediated job holds at a third of its steps and checkpoints every sixth.
        for name, least in (
            ("compare_steps", 1),
            ("compare_batch_size", 1),
            ("remediation_steps", 6),
            ("edge_requests", 1),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InvalidRequestError(
                    f"TourSize.{name} must be an int >= {least}, got {value!r}"
                )
        if not isinstance(self.health_real_rate, bool):
            raise InvalidRequestError(
                f"TourSize.health_real_rate must be a bool, got {self.health_real_rate!r}"
            )

    @classmethod
    def quick(cls) -> TourSize:
        # On a CPU-backed twin auto moves to fp16 after its first step, and CPU fp16 is
        # emulated (far slower than fp32: 15 s for one step of 16 sequences on a 2-core VM,
        # 0.35 s in fp32): two steps of two sequences still show the switch.
        return cls(
            compare_steps=2,
            compare_batch_size=2,
            remediation_steps=60,
            edge_requests=4,
            health_real_rate=False,
        )


def run_demo(console: Console, size: TourSize | None = None) -> dict[str, Any]:
    """Run the tour; return what it measured (the closing summary)."""
    from gpuflow.hardware.home import gpuflow_home
    from gpuflow.tour.record import recording

    size = size or TourSize()
    started = time.perf_counter()
    with recording(gpuflow_home()) as rec:
        console.print(
            Panel.fit(
                "gpuflow tour on the digital twin (a mixed fleet: A100, V100, Hygon DCU)\n"
                f"state: {rec.home}\nrecords: Prefect {rec.prefect}, MLflow {rec.mlflow}",
                title="gpuflow demo",
            )
        )
        from gpuflow.hardware.inventory import Inventory
        from gpuflow.hardware.partition import load_plan
        from gpuflow.hardware.sim import SimBackend
        from gpuflow.tasks.fleet import fleet_rows
        from gpuflow.tour import edge, fleet, health, precision, remediation, summary

        twin = SimBackend()
        inventory = Inventory()
        plan = load_plan(tour_plan_path())
        results: dict[str, Any] = {}
        steps: list[tuple[str, str, Callable[[], Any]]] = [
            ("discover the fleet", "rows", lambda: fleet.discover(twin, inventory)),
            (
                "apply partition plan 'tour'",
                "apply",
                lambda: fleet.partition(twin, inventory, plan),
            ),
            ("refuse an impossible plan", "refusal", lambda: fleet.refuse_impossible(twin, plan)),
            (
                "compare precision: fp32 vs auto (train flow x2, MLflow)",
                "compare",
                lambda: precision.compare(size.compare_steps, size.compare_batch_size),
            ),
            (
                "health champion: LSTM vs trees vs rules by validation cost (health_train)",
                "health",
                lambda: health.train_champion(size.health_real_rate),
            ),
            (
                "predicted fault: HBM degradation -> monitor -> remediate",
                "fault",
                lambda: remediation.predicted_fault_step(
                    size.remediation_steps, results["health"]["registered"]
                ),
            ),
            (
                "edge deploy: slice resnet18-digits over 3 loopback nodes",
                "edge",
                lambda: edge.deploy_and_teardown(size.edge_requests),
            ),
        ]
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            overall = progress.add_task("tour", total=len(steps))
            for label, key, step in steps:
                progress.update(overall, description=label)
                results[key] = step()
                progress.advance(overall)
        return summary.show(console, results, fleet_rows(twin), rec, time.perf_counter() - started)
