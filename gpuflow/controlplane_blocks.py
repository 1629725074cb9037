"""What `gpuflow up` keeps on the Prefect server in PREFECT_API_URL, one process a step
(each `prefect` command would start an interpreter of its own):

    python -m gpuflow.controlplane_blocks setup POOL MLFLOW_URL  # before `prefect deploy --all`
    python -m gpuflow.controlplane_blocks nodes POOL NODE...     # after it (controlplane_nodes)

setup: the process work pool, gpuflow's Block types and default Blocks, and the MLflow URL
that joining hosts record to.
"""

from __future__ import annotations

import os
import sys

from gpuflow.blocks import CheckpointStorage, EdgeFleet, GpuCluster


def create_work_pool(pool: str) -> None:
    """A process work pool with Prefect's default job template (replaced if it exists)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.workers.process import ProcessWorker

    template = ProcessWorker.get_default_base_job_template()
    with get_client(sync_client=True) as client:
        client.create_work_pool(
            WorkPoolCreate(name=pool, type="process", base_job_template=template),
            overwrite=True,
        )


def register_block_types() -> list[str]:
    """gpuflow's Block types, as `prefect block register -m gpuflow.blocks` does."""
    types = (CheckpointStorage, EdgeFleet, GpuCluster)
    for block_type in types:
        block_type.register_type_and_schema()
    return [t.get_block_type_slug() for t in types]


def save_default_blocks() -> list[str]:
    """`gpuflow-default` GpuCluster and `gpuflow-local` CheckpointStorage; kept if they exist."""
    saved = []
    backend = os.environ.get("GPUFLOW_BACKEND", "auto") or "auto"
    for name, block in (
        ("gpuflow-default", GpuCluster(backend=backend)),
        ("gpuflow-local", CheckpointStorage()),
    ):
        try:
            type(block).load(name)
        except ValueError:
            block.save(name)
            saved.append(name)
    return saved


def main(argv: list[str]) -> int:
    from gpuflow.controlplane_nodes import register_nodes, save_mlflow_url

    step, pool, *rest = argv
    if step == "setup":
        (mlflow_url,) = rest
        create_work_pool(pool)
        print("block types:", ", ".join(register_block_types()))
        print("saved:", ", ".join(save_default_blocks()) or "nothing new")
        save_mlflow_url(mlflow_url)
    elif step == "nodes":
        print("node deployments:", ", ".join(register_nodes(rest, pool)) or "none")
    else:
        print(f"unknown step {step!r}: setup or nodes", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
