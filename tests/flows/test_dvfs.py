"""Flow `dvfs` (flows/dvfs.py) and its MLflow record (tasks/energy/controller_record.py):
the flow cleans up a killed predecessor first and records its run; a run with decisions
logs per device totals, the choice's numbers and the two plots."""

from __future__ import annotations

import time

import pytest
from gpuflow.flows.dvfs import dvfs_controller
from gpuflow.hardware.inventory import Inventory
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks import tracking
from gpuflow.tasks.energy.controller import run_controller
from gpuflow.tasks.energy.controller_record import record_controller_run
from gpuflow.tasks.energy.settings import DeviceSettings

from tests.helpers.dvfs_job import TwinJob


def test_the_flow_puts_back_what_a_killed_run_left_and_records() -> None:
    twin, inv = SimBackend(), Inventory()
    inv.sync(twin)
    # A run killed a minute ago: its 5 s hold, written on a clock a minute behind, lapsed.
    past = Inventory(now=lambda: time.time() - 60)
    DeviceSettings(twin, past, "dvfs:killed", ttl_s=5).apply_power_limit("a100-0", 0, 150_000)
    past.close()
    out = dvfs_controller(duration_s=0.0)  # one tick, no wait
    assert [(c["holder"], c["status"]) for c in out["cleaned"]] == [("dvfs:killed", "restored")]
    assert twin.power_limits("a100-0", 0).limit_mw == twin.power_limits("a100-0", 0).max_limit_mw
    assert inv.settings() == [] and out["holder"].startswith("dvfs:")
    run = tracking.tracking_client().get_run(out["mlflow_run_id"])
    assert run.data.metrics["cleaned_on_start"] == 1.0 and run.info.status == "FINISHED"
    with pytest.raises(ValueError, match="below 5 s"):
        dvfs_controller(interval_s=1.0, duration_s=0.0)
    inv.close()


def test_a_decision_is_recorded_with_its_numbers_and_plots() -> None:
    twin = SimBackend()
    inv = Inventory(now=twin.now_s)
    inv.sync(twin)
    job = TwinJob(twin, inv, "job-7", "a100-0", 1)
    run = run_controller(twin, inv, duration_s=120.0, holder="dvfs:rec", wait=job.run)
    assert run.decisions
    run_id = record_controller_run(run, {"interval_s": 5.0})
    client = tracking.tracking_client()
    metrics = client.get_run(run_id).data.metrics
    key = "a100-0_1/job-7"
    assert metrics[f"{key}/energy_j"] > 0 and metrics[f"{key}/chosen_power_limit_w"] < 400
    assert metrics[f"{key}_power_limit_w"] == run.decisions[-1].choice.chosen.setting
    files = {f.path for f in client.list_artifacts(run_id, f"energy/dvfs/{key}")}
    assert {
        f"energy/dvfs/{key}/decision-0{s}" for s in (".json", "-pareto.png", "-curve.png")
    } <= files
    inv.close()
