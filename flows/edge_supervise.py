"""Flow `edge_supervise`: keep a deployed edge chain serving.

    pass ─ (wait interval_s) ─ pass ─ ...   each pass: dead shards restarted where they
                                            were, tail first; degraded meanwhile, active
                                            again once every shard answers

The deployment in prefect.yaml runs ``passes`` passes ``interval_s`` apart every hour,
one run at a time; a second supervisor anywhere waits on the deployment's lock
(tasks/edge/supervise.py) and finds nothing left to do.
"""

from __future__ import annotations

import time

from gpuflow.tasks.edge.supervise import supervise_task
from prefect import flow


@flow(name="edge_supervise", log_prints=True)
def edge_supervise(
    name: str = "resnet18-digits", passes: int = 1, interval_s: float = 10.0
) -> list[dict]:
    """``passes`` supervision passes over the current version of deployment ``name``."""
    if passes < 1 or interval_s < 1:
        raise ValueError(f"passes ({passes}) and interval_s ({interval_s}) must be >= 1")
    results = []
    for index in range(passes):
        results.append(supervise_task(name))
        if results[-1]["restarted"]:
            print(f"{name} {results[-1]['version']}: restarted shard(s) {results[-1]['restarted']}")
        if index + 1 < passes:
            time.sleep(interval_s)
    return results
