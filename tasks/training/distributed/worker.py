"""One rank of a gang: the process torchelastic's agent starts (``rank_main``).

It binds itself to its unit (gang.py) before CUDA starts, joins the process group with
the gang's backend, and runs the project's training loop with the spec's parallelism unit
(``parallel``: DataParallel for "ddp", FSDP2's ShardedParallel for "fsdp"). Rank 0 alone
reads the control channel, acknowledges requests, reports committed checkpoints to the
inventory, runs the step observers (a test's step gate) and relays its steps to the
launcher's (relay.py: a progress bar); every rank reports its workload to its own unit
(the twin's utilization, power and heat of that device) and acts on rank 0's decisions.
Returns the loop's result as a dict (the agent collects one per rank), rank 0's under
"rank0" in every rank's. With ``record`` (``gpuflow bench distributed``) a rank's result
also carries what a benchmark cannot see from outside: rank 0's per-step losses and
start-up time, and every rank's checkpoint stalls.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from gpuflow.tasks.training.distributed.gang import GangUnit, bind_this_rank, decode_plan
from gpuflow.tasks.training.distributed.relay import relay_hook


def rank_main(
    spec: Any,  # TrainSpec
    store: Any,  # CheckpointStore (storage.py): what the launcher opened, pickled
    plan_json: str,
    backend: str,
    inventory_url: str | None,
    fencing_token: int | None,
    staging: str,
    attempt: int,
    threads: int = 1,
    run_id: str | None = None,
    record: bool = False,
    device_backend: tuple[str, str | None] | None = None,
    relay: Any = None,  # relay.RelayAddress of the launcher's StepRelay
) -> dict[str, Any]:
    units = decode_plan(plan_json)
    rank = int(os.environ["RANK"])
    unit = bind_this_rank(units, int(os.environ["LOCAL_RANK"]), os.environ)

    import torch  # CUDA (if any) initialises after the binding above
    import torch.distributed as dist
    from gpuflow.tasks.training.control import step_observers
    from gpuflow.tasks.training.loop import train_loop

    torch.set_num_threads(threads)
    device = torch.device("cpu") if unit.vendor == "sim" else torch.device("cuda", 0)
    dist.init_process_group(
        backend, store=round_store(), rank=rank, world_size=int(os.environ["WORLD_SIZE"])
    )
    try:
        probe = None
        parallel = gang_parallel(spec, device, Path(staging))
        inventory = control = None
        if rank == 0 and inventory_url:
            from gpuflow.hardware.inventory import Inventory
            from gpuflow.tasks.training.control import FencedControl

            inventory = Inventory(inventory_url)
            control = FencedControl(inventory, spec.job_id, attempt, None)

        def committed(cid: str, step: int) -> None:
            if inventory is not None:
                inventory.transition_job(
                    spec.job_id, expect_attempt=attempt, last_checkpoint_id=cid
                )

        hooks = []
        if rank == 0:
            observers = list(step_observers)
            hooks += [lambda info, obs=obs: obs(spec.job_id, spec.steps, info) for obs in observers]
            hooks += [h for h in (relay_hook(relay),) if h is not None]
        probe = unit_probe(device_backend, unit, spec.job_id, rank)
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
            store,
            device=device,
            control=control,
            hooks=hooks,
            on_checkpoint=committed,
            fencing_token=fencing_token,
            parallel=parallel,
            utilization=probe,
        )
        if metrics is not None:
            metrics.flush()
        out = result.to_dict()
        out.update(rank=rank, world_size=parallel.world_size, resource_id=unit.resource_id)
        if recorder is not None:
            out.update(recorder.figures(started))
        # Rank 0 lands on whichever node the rendezvous puts it: every rank carries its
        # result ("rank0"), so each node's agent returns it (the first node's launcher
        # records the job from it).
        box = [out if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return {**out, "rank0": box[0]}
    finally:
        if probe is not None:
            probe.close()
        dist.destroy_process_group()


def rank_owner(job_id: str, rank: int) -> str:
    """The workload owner a rank reports as (one per rank: the twin keys tenants by it)."""
    return f"{job_id}/rank-{rank}"


def unit_probe(
    device_backend: tuple[str, str | None] | None,
    unit: GangUnit,
    job_id: str,
    rank: int,
    min_interval_s: float = 0.5,
) -> Any:
    """This rank's DeviceUtilization on its own unit, through the hardware backend; None
    when the launcher named none."""
    if device_backend is None:
        return None
    from gpuflow.hardware.select import get_backend
    from gpuflow.tasks.training.utilization import DeviceUtilization

    name, spec_path = device_backend
    backend = get_backend(name, spec_path=Path(spec_path) if spec_path else None)
    return DeviceUtilization(
        backend,
        unit.node,
        unit.device_index,
        owner=rank_owner(job_id, rank),
        partition_uuid=unit.resource_id if unit.profile else None,
        min_interval_s=min_interval_s,
    )


def gang_parallel(spec: Any, device: Any, staging: Path) -> Any:
    """This rank's parallelism unit for ``spec.parallel`` (in a joined process group)."""
    if spec.parallel == "fsdp":
        from gpuflow.tasks.training.distributed.fsdp import ShardedParallel

        return ShardedParallel(device, staging, spec.precision)
    from gpuflow.tasks.training.distributed.ddp import DataParallel

    return DataParallel(device, staging)


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


class RoundPortTakenError(RuntimeError):
    """Rank 0 could not listen on the port the agent chose for this round's store."""


def round_store() -> Any:
    """The store this round of the gang's ranks meet on.

    The launcher (launch.py) has torchelastic bootstrap every round on a fresh store that
    this round's rank 0 hosts on a fresh port (MASTER_ADDR/MASTER_PORT, set per round by
    the node-rank-0 agent): no key of a dead round can be read, whichever node restarted.
    Under an agent that shares its own store across rounds instead
    (TORCHELASTIC_USE_AGENT_STORE=True, e.g. plain torchrun), the dead round's keys (the
    addresses its ranks listened on) are still there, so the keys get a per-round prefix:
    the agent's restart count. That count is per agent: a node whose ranks were restarted
    because another node's failed ("membership change") does not count it, so under a
    shared store it names the round only for a gang of one node.
    """
    from datetime import timedelta

    import torch.distributed as dist

    agent_hosts_it = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    hosts_it = not agent_hosts_it and os.environ["RANK"] == "0"
    try:
        store = dist.TCPStore(
            address,
            port,
            int(os.environ["WORLD_SIZE"]),
            is_master=hosts_it,
            timeout=timedelta(minutes=5),
            multi_tenant=True,
        )
    except dist.DistNetworkError as exc:
        # The agent chose the port by binding port 0 and letting it go (torchelastic's
        # get_free_port) seconds before this rank, started and torch imported, listens:
        # any process may take it meanwhile. Nothing to retry here, the other ranks know
        # only this port: the round fails and torchelastic restarts it on a fresh one.
        if hosts_it and "EADDRINUSE" in str(exc):
            raise RoundPortTakenError(
                f"rank 0 cannot host this round's store on {address}:{port}: another "
                "process took the port after the agent chose it; the agent restarts the "
                "gang on a fresh port while its max_restarts allow"
            ) from exc
        raise
    if not agent_hosts_it:
        return dist.PrefixStore("gpuflow", store)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"gpuflow/round-{restart}", store)
