"""A remediation killed mid-way is finished by the `reconcile` flow.

The remediation runs in its own process (as a deployment's flow run would) and is killed
with SIGKILL while it waits for the job's checkpoint: no hook, no finally, nothing of it
runs again. Its claim on the incident lapses (a 2 s TTL for this process, through
GPUFLOW_INCIDENT_CLAIM_TTL_S); the job, held at a step gate the test controls, answers the
dead run's request afterwards and stops with a checkpoint. The reconciler then takes the
incident over and moves the job, with no step lost, onto the target the dead run had
reserved.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.flows.reconcile import reconcile
from gpuflow.hardware.inventory import Inventory
from gpuflow.tasks.remediation import ledger as L
from gpuflow.tasks.remediation.launch import RUNNER

from tests.helpers.step_gate import StepGates
from tests.tasks.remediation.helpers import make_cluster, small_spec, wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parents[2]
JOB = "rc-killed"

REMEDIATE = """
import sys
from gpuflow.blocks.gpu_cluster import GpuCluster
from gpuflow.flows.remediate import remediate
from gpuflow.tasks.remediation.steps import RemediationPolicy

remediate(
    device=sys.argv[1],
    trigger="predicted",
    risk=0.93,
    reason="test: killed mid-way",
    cluster=GpuCluster(backend="sim", cluster_spec=sys.argv[2]),
    policy=RemediationPolicy(checkpoint_timeout_s=600),
)
"""


@pytest.fixture
def gates(tmp_path: Path) -> Iterator[StepGates]:
    with StepGates(tmp_path / "gates") as made:
        yield made


@pytest.mark.timeout(300)
def test_a_remediation_killed_mid_way_is_finished_by_the_reconciler(
    gpuflow_home, gates, tmp_path
) -> None:
    from prefect.settings import PREFECT_API_URL

    cluster = make_cluster(gpuflow_home)
    gate = gates(40, JOB)
    handle = RUNNER.start(
        small_spec(JOB, steps=120, interval=25),
        CheckpointStorage(path=str(tmp_path / "ck")),
        cluster,
        step_hooks=(gate.hook,),
    )
    assert gate.wait_reached(60), "the job never reached step 40"
    device = handle.segments[0].device
    inv = Inventory()
    env = {
        **os.environ,
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        L.CLAIM_TTL_ENV: "2",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", REMEDIATE, device, cluster.cluster_spec],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: (
                proc.poll() is not None
                or any(r.status == "pending" for r in inv.control_requests(JOB))
            ),
            120,
            "remediation to ask the job for its checkpoint",
            poll_s=0.1,
        )
        assert proc.poll() is None, proc.stderr.read()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

    ledger = L.Ledger(inv.url)
    (incident,) = ledger.incidents()
    assert incident.status == "open" and incident.phase == L.CHECKPOINTING
    wait_until(lambda: ledger.abandoned(), 30, "the dead run's claim to lapse", poll_s=0.1)
    gate.open()  # the job answers the dead run's request: checkpoint, stop
    wait_until(lambda: handle.segments[0].ended_at_s is not None, 60, "the job to stop")
    assert handle.segments[0].stopped_by_request
    attempt = inv.job(JOB).attempt
    (reserved,) = [lease for lease in inv.leases(owner=JOB) if lease.attempt > attempt]

    out = reconcile(cluster=cluster)

    assert out["reconciled"][incident.incident_id]["action"] == "finish"
    assert out["reconciled"][incident.incident_id]["outcome"] == "done"
    done = ledger.incident(incident.incident_id)
    whats = [e["what"] for e in done.timeline]
    assert done.status == "done" and done.phase == L.CLOSED and done.takeovers == 1
    assert (
        L.TAKEN_OVER in whats
        and whats[-2:] == [L.JOB_RESUMED, L.NOTIFIED]
        or (L.JOB_RESUMED in whats)
    )
    assert handle.wait(120) and handle.finished, handle.error
    first, second = handle.segments
    assert second.resource_id == reserved.resource_id  # the dead run's reservation, reused
    assert second.first_step == first.last_step + 1  # no step lost, none repeated
    assert inv.job(JOB).state == "finished" and inv.leases(owner=JOB) == []
    assert ledger.abandoned() == []
