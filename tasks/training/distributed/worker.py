"""One rank of a gang: the process torchelastic's agent starts (``rank_main``).

It binds itself to its unit (gang.py) before CUDA starts, joins the process group with
the gang's backend, and runs the project's training loop with DataParallel. Rank 0 alone
reads the control channel, acknowledges requests, reports committed checkpoints to the
inventory and runs the step observers (a progress bar, a test's step gate); every rank
acts on rank 0's decisions. Returns the loop's result as a dict (the agent collects one
per rank). With ``record`` (``gpuflow bench distributed``) a rank's result also carries what
a benchmark cannot see from outside: rank 0's per-step losses and start-up time, and every
rank's checkpoint stalls.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from gpuflow.tasks.training.distributed.gang import bind_this_rank, decode_plan


def rank_main(
    spec: Any,  # TrainSpec
    storage: Any,  # CheckpointStorage
    plan_json: str,
    backend: str,
    inventory_url: str | None,
    fencing_token: int | None,
    staging: str,
    attempt: int,
    threads: int = 1,
    run_id: str | None = None,
    record: bool = False,
) -> dict[str, Any]:
    units = decode_plan(plan_json)
    rank = int(os.environ["RANK"])
    unit = bind_this_rank(units, int(os.environ["LOCAL_RANK"]), os.environ)

    import torch  # CUDA (if any) initialises after the binding above
    import torch.distributed as dist
    from gpuflow.tasks.training.distributed.ddp import DataParallel
    from gpuflow.tasks.training.job import step_observers
    from gpuflow.tasks.training.loop import train_loop
    from gpuflow.tasks.training.storage import open_store

    torch.set_num_threads(threads)
    device = torch.device("cpu") if unit.vendor == "sim" else torch.device("cuda", 0)
    dist.init_process_group(
        backend, store=_round_store(), rank=rank, world_size=int(os.environ["WORLD_SIZE"])
    )
    try:
        parallel = DataParallel(device, Path(staging))
        inventory = control = None
        if rank == 0 and inventory_url:
            from gpuflow.hardware.inventory import Inventory
            from gpuflow.tasks.training.job import FencedControl

            inventory = Inventory(inventory_url)
            control = FencedControl(inventory, spec.job_id, attempt, None)

        def committed(cid: str, step: int) -> None:
            if inventory is not None:
                inventory.transition_job(
                    spec.job_id, expect_attempt=attempt, last_checkpoint_id=cid
                )

        hooks = [lambda info, obs=obs: obs(spec.job_id, spec.steps, info) for obs in step_observers]
        metrics = None
        if rank == 0 and run_id:
            from gpuflow.tasks.tracking import StepMetricsLogger

            metrics = StepMetricsLogger(run_id)
            hooks.append(
                lambda info: metrics.log(
                    info.step, {"loss": info.loss, "samples_per_s": info.samples_per_s}
                )
            )
        recorder = RankRecorder(parallel) if record else None
        if recorder is not None and rank == 0:
            hooks.append(recorder.step)
        started = time.perf_counter()
        result = train_loop(
            spec,
            open_store(storage),
            device=device,
            control=control,
            hooks=hooks,
            on_checkpoint=committed,
            fencing_token=fencing_token,
            parallel=parallel,
        )
        if metrics is not None:
            metrics.flush()
        out = result.to_dict()
        out.update(rank=rank, world_size=parallel.world_size, resource_id=unit.resource_id)
        if recorder is not None:
            out.update(recorder.figures(started))
        return out
    finally:
        dist.destroy_process_group()


class RankRecorder:
    """What ``record=True`` adds to a rank's result: ``losses`` (rank 0: the global batch's
    loss after each step), ``to_first_step_s`` (rank 0: from train_loop's call to its first
    step, that step's own time left out: build, restore, wrap) and ``checkpoint_stalls_s``
    (DcpCheckpointer.stalls_s: how long each save held this rank up)."""

    def __init__(self, parallel: Any) -> None:
        self.losses: list[float] = []
        self.first_step_at: float | None = None
        self.first_step_s = 0.0
        self.checkpointers: list[Any] = []
        build = parallel.checkpointer

        # train_loop builds its checkpointer inside; keeping it is the only way to its stalls.
        def keep(*args: Any, **kwargs: Any) -> Any:
            self.checkpointers.append(build(*args, **kwargs))
            return self.checkpointers[-1]

        parallel.checkpointer = keep

    def step(self, info: Any) -> None:  # a StepInfo
        if self.first_step_at is None:
            self.first_step_at, self.first_step_s = time.perf_counter(), info.step_time_s
        self.losses.append(info.loss)

    def figures(self, started: float) -> dict[str, Any]:
        first = None
        if self.first_step_at is not None:
            first = self.first_step_at - started - self.first_step_s
        stalls = [s for c in self.checkpointers for s in getattr(c, "stalls_s", [])]
        return {"losses": self.losses, "to_first_step_s": first, "checkpoint_stalls_s": stalls}


def _round_store() -> Any:
    """The rendezvous store, keyed by this round of the gang (torchelastic's restart count).

    After a restart the agent's store still holds the dead round's keys (the addresses its
    ranks listened on); without a per-round prefix the new ranks read those and try to
    connect to processes that are gone.
    """
    from datetime import timedelta

    import torch.distributed as dist

    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    agent_hosts_it = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        is_master=not agent_hosts_it and os.environ["RANK"] == "0",
        timeout=timedelta(minutes=5),
        multi_tenant=True,
    )
    return dist.PrefixStore(f"gpuflow/round-{restart}", store)
