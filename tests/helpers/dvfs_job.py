"""A stand-in training job on the twin for the DVFS controller's tests: it holds a lease
on one device, runs there as a tenant, and reports progress at the rate the device's
clock allows (base step time + Backend.device_delay_s, as the training loop sleeps it), so
a lower power limit really slows it. The test moves time with ``run(seconds)``, which
fast-forwards the twin: no sleeps."""

from __future__ import annotations

from pathlib import Path

from gpuflow.hardware.inventory import Inventory, JobState
from gpuflow.hardware.sim import SimBackend


class TwinJob:
    def __init__(
        self,
        twin: SimBackend,
        inv: Inventory,
        job_id: str,
        node: str,
        index: int,
        *,
        base_step_s: float = 0.1,
        memory_bound_ratio: float = 0.3,
        publish: bool = True,
    ) -> None:
        self.twin, self.inv, self.job_id = twin, inv, job_id
        self.node, self.index = node, index
        self.base_step_s = base_step_s
        self.publish = publish
        self.units = 0.0
        self.uuid = twin.device(node, index).uuid
        inv.record_job(job_id, {"model": "tiny"}, state=JobState.RUNNING, resource_ids=[self.uuid])
        inv.acquire_lease(self.uuid, job_id, 10**7)
        twin.set_workload(node, index, job_id, 1.0, memory_bound_ratio=memory_bound_ratio)
        self.report()

    def step_s(self) -> float:
        """One step's time at the clock the device runs now."""
        delay = self.twin.device_delay_s(self.node, self.index, self.job_id, self.base_step_s)
        return self.base_step_s + delay

    def run(self, seconds: float, *, slow: float = 1.0) -> None:
        """Work ``seconds`` of twin time (``slow`` x longer steps: a noisy interval)."""
        step = self.step_s() * slow
        self.twin.advance(seconds)
        self.units += seconds / step
        self.report()

    def report(self) -> None:
        if self.publish:
            self.inv.report_progress(self.job_id, self.units)

    def end(self) -> None:
        self.inv.transition_job(self.job_id, JobState.FINISHED)
        self.inv.release_lease(self.uuid, self.job_id)
        self.twin.clear_workload(self.job_id)


def a100_twin(tmp_path: Path, name: str, seed: int, count: int) -> SimBackend:
    """A twin of one A100 40GB node ("a100-0": 100..400 W, default 400 W) with ``count``
    devices and no natural faults, its spec written under ``tmp_path``."""
    import yaml

    fleet = {
        "name": name,
        "seed": seed,
        "faults": {"natural": False},
        "nodes": [
            {
                "name": "a100-0",
                "region": "r1",
                "role": "active",
                "devices": [{"sku": "a100-40gb", "count": count}],
            }
        ],
    }
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump(fleet), encoding="utf-8")
    return SimBackend(spec_path=spec)
