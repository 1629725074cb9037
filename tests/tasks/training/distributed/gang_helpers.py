"""What the gang tests share: the twin units of one node, a small llama-tiny spec, and two
"nodes" of this machine, each running its own agent in its own process."""

from __future__ import annotations

import multiprocessing
import pickle
import socket
import time
from pathlib import Path
from typing import Any

from gpuflow.tasks.training.distributed.gang import GangUnit
from gpuflow.tasks.training.spec import TrainSpec

UNITS = [GangUnit(f"twin-{i}", "h0", i, "sim") for i in range(3)]


def gang_spec(job_id: str, steps: int, **fields: Any) -> TrainSpec:
    """llama-tiny, checkpoints every 10 steps; batch 6 splits into 1, 2 or 3 ranks, and
    fp32 (unless ``fields`` say otherwise) so resumes compare tightly."""
    base: dict[str, Any] = {
        "job_id": job_id,
        "model": "llama-tiny",
        "steps": steps,
        "checkpoint_interval": 10,
        "batch_size": 6,
        "seq_len": 16,
        "precision": "fp32",
        "eval_batches": 1,
    }
    return TrainSpec(**{**base, **fields})


# Two "nodes" of this machine: h0 holds twin-0 (and hosts the rendezvous), h1 twin-1.
TWO_NODES = [GangUnit("twin-0", "h0", 0, "sim"), GangUnit("twin-1", "h1", 1, "sim")]


def _node_agent(args: tuple, options: dict[str, Any], out: Path, entry: Any) -> None:
    """One node's agent, in a process of its own (the agent's main thread, as on a node)."""
    from gpuflow.tasks.training.distributed import launch

    if entry is not None:
        launch.rank_main = entry  # what the agent starts in each rank process
    out.write_bytes(pickle.dumps(launch.run_node_agent(*args, **options)))


def run_nodes(
    spec: TrainSpec,
    storage: Any,  # CheckpointStorage, the store every node reaches
    units: list[GangUnit],
    root: Path,
    timeout_s: float = 240.0,
    entry: Any = None,
    **options: Any,
) -> dict[int, dict[str, Any]]:
    """Every node of ``units`` runs its own agent (run_node_agent) in its own process,
    with its own staging folder ``root/staging-<node>``; every rank's result, by rank.
    ``entry``: what each rank process runs instead of worker.rank_main."""
    ctx = multiprocessing.get_context("spawn")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nodes = list(dict.fromkeys(u.node for u in units))
    procs = []
    for node in nodes:
        args = (spec, storage, units, node, ("127.0.0.1", port))
        kw = {"staging": root / f"staging-{node}", "local_addr": "127.0.0.1", **options}
        kw.setdefault("join_timeout_s", 120)
        # Not a daemon: an agent starts rank processes of its own.
        proc = ctx.Process(target=_node_agent, args=(args, kw, root / f"result-{node}.pkl", entry))
        proc.start()
        procs.append(proc)
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        proc.join(max(1.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()  # the agent stops its ranks on SIGTERM
            proc.join(30)
    failed = {n: p.exitcode for n, p in zip(nodes, procs, strict=True) if p.exitcode != 0}
    assert not failed, f"node agents failed (exit codes): {failed}"
    results: dict[int, dict[str, Any]] = {}
    for node in nodes:
        results.update(pickle.loads((root / f"result-{node}.pkl").read_bytes()))
    return results


def dying_rank_main(*args: Any) -> dict[str, Any]:
    """worker.rank_main, except that in a gang's first round, at step 15 (its step-10
    checkpoint committed), rank 0 dies and the other ranks sleep, healthy and in no
    collective: their agents restart them because another node's agent came back to the
    rendezvous (a membership change, which torchelastic does not count as a restart)
    while the dead rank's agent counts one. The result carries the round's restart count."""
    import os

    from gpuflow.tasks.training.distributed.ddp import GangParallel
    from gpuflow.tasks.training.distributed.worker import rank_main

    count = os.environ["TORCHELASTIC_RESTART_COUNT"]
    if count == "0":
        mean, checkpointer = GangParallel.mean, GangParallel.checkpointer
        kept: list[Any] = []
        calls = [0]

        def keep(self: Any, *a: Any, **kw: Any) -> Any:
            kept.append(checkpointer(self, *a, **kw))
            return kept[-1]

        def mean_of_a_dying_round(self: Any, value: float) -> float:
            calls[0] += 1
            if calls[0] == 15:
                kept[-1].flush()  # the step-10 checkpoint is committed
                if self.rank == 0:
                    os._exit(17)
                time.sleep(60)  # stopped by the agent well before it wakes
            return mean(self, value)

        GangParallel.mean, GangParallel.checkpointer = mean_of_a_dying_round, keep
    return {**rank_main(*args), "restart_count": int(count)}


def rank_of_this_process() -> int:
    """A rank's entry point that only says which global rank it is."""
    import os

    return int(os.environ["RANK"])


def refusing_rank() -> None:
    """A rank's entry point that fails at once."""
    raise RuntimeError("this rank refuses")


def port_taken_rank_main(*args: Any) -> dict[str, Any]:
    """worker.rank_main, except that in a gang's first round a socket of this process (the
    stand-in for any other process) listens on the port the agent chose for the round's
    store before rank 0 tries to: what happens when another process binds it between the
    agent's choice and rank 0's listen. The result carries the round's restart count."""
    import os

    from gpuflow.tasks.training.distributed.worker import rank_main

    count = os.environ["TORCHELASTIC_RESTART_COUNT"]
    if count == "0" and os.environ["RANK"] == "0":
        taker = socket.socket()
        taker.bind((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
        taker.listen()  # held until this rank process ends
    return {**rank_main(*args), "restart_count": int(count)}
