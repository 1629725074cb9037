"""A DVFS controller in a process of its own, for the SIGKILL test
(tests/tasks/energy/test_controller_kill.py): it starts a stand-in job on one twin device
(tests/helpers/dvfs_job.py) and runs run_controller on it, the job working each interval
instead of a sleep, until it is killed. The test watches the settings ledger and the twin,
not this process's output.

    python tests/helpers/dvfs_controller_entry.py URL HOLDER NODE INDEX JOB TTL_S

The twin follows GPUFLOW_HOME, inherited from the test.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.helpers

from gpuflow.hardware.inventory import Inventory  # noqa: E402
from gpuflow.hardware.sim import SimBackend  # noqa: E402
from gpuflow.tasks.energy.controller import run_controller  # noqa: E402
from gpuflow.tasks.energy.optimizer import Objective  # noqa: E402

from tests.helpers.dvfs_job import TwinJob  # noqa: E402

PACE_S = 0.02  # a breath per interval, so the child does not take a core from the test


def main(argv: list[str]) -> None:
    url, holder, node, index, job_id, ttl_s = argv
    twin = SimBackend()
    inv = Inventory(url, now=twin.now_s)  # the twin's clock, as the test's inventory
    job = TwinJob(twin, inv, job_id, node, int(index))

    def work(seconds: float) -> None:
        job.run(seconds)
        time.sleep(PACE_S)

    run_controller(
        twin,
        inv,
        objective=Objective(slowdown=0.10),
        interval_s=5.0,
        duration_s=1e9,
        holder=holder,
        ttl_s=float(ttl_s),
        wait=work,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
