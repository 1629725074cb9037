"""Launch and supervise a gang: torchelastic's agents, started and watched by gpuflow.

A gang of N units on M nodes runs as M elastic agents, one per node, the way multi-node
torchrun does (torch.distributed.launcher's ``elastic_launch``, torchrun's own launcher
API). ``run_node_agent`` runs THIS node's agent: it starts one rank process per unit of
this node, joins the other nodes' agents in a c10d rendezvous (min = max = M nodes)
hosted by the agent of the gang's first node, and restarts the whole gang from its last
committed checkpoint when a rank dies, up to ``max_restarts`` times; beyond that it
raises and the job goes the way a crashed one goes (remediation). ``run_gang`` is the one
node case: this node's agent alone, its rendezvous on loopback. Who starts the other
nodes' agents (a Prefect flow run on each node's work queue) is not here yet
(docs/distributed.md).

Each agent's torchelastic log folder (a rank's error.json when it fails; the ranks' output
itself goes to this process's console) is made under the node's staging folder, removed
when the gang succeeds and kept when it fails: the GangFailedError names the file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.tasks.training.distributed.gang import (
    GangUnit,
    check_world_sizes,
    choose_backend,
    encode_plan,
)
from gpuflow.tasks.training.distributed.relay import StepRelay
from gpuflow.tasks.training.distributed.worker import rank_main
from gpuflow.tasks.training.spec import TrainSpec
from gpuflow.tasks.training.storage import open_store

# torchelastic's switch (dynamic_rendezvous.py, ``use_agent_store``): with it, every round
# bootstraps the ranks on a fresh store hosted by that round's rank 0 on a fresh port,
# instead of the node-rank-0 agent's one store reused across rounds (see worker.py's
# round_store for why a reused store needs a gang-wide round, which several agents lack).
_FRESH_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


class GangFailedError(RuntimeError):
    """The gang failed more often than its max_restarts allowed."""


def free_port(address: str = "127.0.0.1") -> int:
    """A port free on ``address`` now: where a gang's rendezvous is hosted."""
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def check_gang(
    spec: TrainSpec, units: Sequence[GangUnit], *, across_nodes: bool = False
) -> dict[str, list[GangUnit]]:
    """Refuse, before anything starts, a gang that cannot split its batch, has no unit,
    names a unit twice, or spans nodes where ``across_nodes`` is not allowed (one agent
    for all units: ``run_gang``). Returns the units grouped per node, in the order the
    nodes first appear (the first is the gang's first unit's: it hosts the rendezvous)."""
    if not units:
        raise InvalidRequestError(f"job {spec.job_id!r}: a gang needs at least one unit")
    ids = [u.resource_id for u in units]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise InvalidRequestError(f"job {spec.job_id!r}: units {twice} appear more than once")
    per_node: dict[str, list[GangUnit]] = {}
    for unit in units:
        per_node.setdefault(unit.node, []).append(unit)
    if len(per_node) > 1 and not across_nodes:
        raise InvalidRequestError(
            f"job {spec.job_id!r}: its units span nodes {sorted(per_node)}; run_gang runs "
            "one node's agent: a gang across nodes needs run_node_agent on each node"
        )
    check_world_sizes(spec.job_id, spec.resolved_batch_size, [len(units)])
    return per_node


def _parse_rendezvous(job_id: str, rendezvous: Any) -> tuple[str, int]:
    try:
        host, port = rendezvous
        port = int(port)
    except (TypeError, ValueError):
        raise InvalidRequestError(
            f"job {job_id!r}: rendezvous {rendezvous!r} is not (host, port)"
        ) from None
    if not isinstance(host, str) or not host or not 0 < port < 65536:
        raise InvalidRequestError(
            f"job {job_id!r}: rendezvous {rendezvous!r} needs a host name and a port in 1-65535"
        )
    return host, port


# Agents running in this process now (threads may each run one: a test's nodes): the
# variable is set while any runs, and put back as it was when the last one ends.
_fresh_store_users = 0
_fresh_store_lock = threading.Lock()
_fresh_store_before: str | None = None


@contextlib.contextmanager
def _fresh_store_per_round() -> Iterator[None]:
    # The agent reads it at every rendezvous and every worker start, all inside the launch.
    global _fresh_store_users, _fresh_store_before
    with _fresh_store_lock:
        if _fresh_store_users == 0:
            _fresh_store_before = os.environ.get(_FRESH_STORE_ENV)
            os.environ[_FRESH_STORE_ENV] = "1"
        _fresh_store_users += 1
    try:
        yield
    finally:
        with _fresh_store_lock:
            _fresh_store_users -= 1
            if _fresh_store_users == 0:
                if _fresh_store_before is None:
                    os.environ.pop(_FRESH_STORE_ENV, None)
                else:
                    os.environ[_FRESH_STORE_ENV] = _fresh_store_before


def launch_agent(
    entrypoint: Any,
    args: tuple[Any, ...],
    *,
    nodes: int,
    nproc: int,
    rendezvous_id: str,
    endpoint: tuple[str, int],
    is_host: bool,
    join_timeout_s: float = 900.0,
    max_restarts: int = 0,
    local_addr: str | None = None,
    what: str = "the gang",
    log_root: Path | None = None,
) -> dict[int, Any]:
    """One elastic agent (torchrun's launcher API) running ``entrypoint(*args)`` in
    ``nproc`` rank processes of a gang of ``nodes`` agents; returns this agent's ranks'
    return values by global rank. ``args`` reach the ranks pickled through the agent's
    spawn pipe, never a command line. Past ``max_restarts`` it raises GangFailedError,
    ``what`` naming the gang. The agent's log folder is made in ``log_root`` (default: the
    system's temporary folder), removed after a success and kept after a failure."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if log_root is not None:
        Path(log_root).mkdir(parents=True, exist_ok=True)
    # torchelastic's default is a fresh /tmp/torchelastic_* per agent, never removed.
    log_dir = tempfile.mkdtemp(prefix="gpuflow-elastic-", dir=log_root)
    host, port = endpoint
    config = LaunchConfig(
        min_nodes=nodes,
        max_nodes=nodes,
        nproc_per_node=nproc,
        run_id=rendezvous_id,
        rdzv_backend="c10d",
        rdzv_endpoint=f"{host}:{port}",
        # Said, not guessed from the host name (c10d_rendezvous_backend._create_tcp_store):
        # on one machine every agent's name matches the endpoint, and whichever came first
        # would host it.
        rdzv_configs={"is_host": is_host},
        rdzv_timeout=int(join_timeout_s),
        max_restarts=max_restarts,
        start_method="spawn",
        monitor_interval=0.2,
        local_addr=local_addr,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
    )
    try:
        with _fresh_store_per_round():
            results = dict(elastic_launch(config, entrypoint)(*args))
    except ChildFailedError as exc:
        raise GangFailedError(f"{what} failed after {max_restarts} restart(s): {exc}") from exc
    shutil.rmtree(log_dir, ignore_errors=True)
    return results


def run_node_agent(
    spec: TrainSpec,
    storage: Any,  # a CheckpointStorage block every node reaches
    units: Sequence[GangUnit],
    node: str,
    rendezvous: tuple[str, int],
    *,
    staging: Path,
    inventory_url: str | None = None,
    fencing_token: int | None = None,
    attempt: int = 0,
    max_restarts: int | None = None,
    backend: str | None = None,
    threads_per_rank: int = 1,
    run_id: str | None = None,
    record: bool = False,
    device_backend: tuple[str, str | None] | None = None,
    local_addr: str | None = None,
    rendezvous_id: str | None = None,
    join_timeout_s: float = 900.0,
) -> dict[int, dict[str, Any]]:
    """Run ``node``'s agent of the gang ``units`` (all of the gang's, every node's, the
    same list on every node); returns this node's ranks' results by global rank.

    ``rendezvous``: (the first node's address, a port) every node's agent is given; the
    agent on the first node (``units[0].node``) hosts the rendezvous store there.
    ``staging``: this node's own folder (no rank reads another node's files: each uploads
    its own shards, and each node fetches a checkpoint for itself, checkpoint.py).
    ``local_addr``: the address the other nodes reach this one at (torchelastic looks up
    this host's FQDN without it); where this node's rank 0 listens if it is the gang's.
    ``rendezvous_id``: the same on every node (default: the job id and attempt).
    ``max_restarts``: how often torchelastic restarts the gang from its last commit
    (default: the spec's). A round whose rank 0 cannot host its store (worker.round_store:
    torchelastic lets the port go before rank 0 listens) is recovered the same way.
    ``record``, ``device_backend``: as for run_gang. Global ranks are what the rendezvous
    assigns: rank 0 (on whichever node) polls control, logs MLflow, commits checkpoints.
    """
    per_node = check_gang(spec, units, across_nodes=True)
    if node not in per_node:
        raise InvalidRequestError(
            f"job {spec.job_id!r}: node {node!r} has no unit in the gang (nodes: "
            f"{', '.join(per_node)})"
        )
    host, port = _parse_rendezvous(spec.job_id, rendezvous)
    chosen = choose_backend(units, backend)
    mine = per_node[node]
    # Pickled to the ranks through the agent's spawn pipe: never on a command line, and a
    # storage's SecretStr keys stay secret (not rendered as text anywhere). The store, not
    # the block: opened (and an S3 bucket checked) once here, and a rank need not import
    # Prefect to read it. Each rank binds to this node's unit at its LOCAL_RANK.
    args = (
        spec,
        open_store(storage),
        encode_plan(mine),
        chosen,
        inventory_url,
        fencing_token,
        str(staging),
        attempt,
        threads_per_rank,
        run_id,
        record,
        device_backend,
    )
    from gpuflow.tasks.training.control import step_observers

    # Whichever node rank 0 lands on relays to its own agent's observers.
    relay = StepRelay(spec.job_id, spec.steps, step_observers) if step_observers else None
    with relay or contextlib.nullcontext():
        results = launch_agent(
            rank_main,
            (*args, relay.address if relay else None),
            nodes=len(per_node),
            nproc=len(mine),
            rendezvous_id=rendezvous_id or f"{spec.job_id}-attempt-{attempt}",
            endpoint=(host, port),
            is_host=node == units[0].node,
            join_timeout_s=join_timeout_s,
            max_restarts=spec.max_restarts if max_restarts is None else max_restarts,
            local_addr=local_addr,
            what=f"job {spec.job_id!r}: the gang of {len(units)} (node {node}: {len(mine)})",
            log_root=staging / "elastic",
        )
    for result in results.values():
        result["backend"] = chosen
    return dict(results)


def run_gang(
    spec: TrainSpec,
    storage: Any,  # a CheckpointStorage block
    units: Sequence[GangUnit],
    *,
    staging: Path,
    **options: Any,
) -> dict[str, Any]:
    """Train ``spec`` as one rank per unit of one node; returns rank 0's result (with
    ``ranks``, every rank's, by rank). This node's agent alone (run_node_agent), its
    rendezvous on loopback; ``options`` are run_node_agent's.

    ``record``: each rank's result also holds its losses and checkpoint stalls (worker.py).
    ``device_backend``: (hardware backend name, twin spec path) the ranks report their
    workload through, each to its own unit (the twin turns it into utilization, power and
    heat of that device; NVML ignores it and measures). This process's step observers
    (a progress bar) see rank 0's steps through a StepRelay.
    """
    check_gang(spec, units)
    options.setdefault("local_addr", "127.0.0.1")
    results = run_node_agent(
        spec,
        storage,
        units,
        units[0].node,
        ("127.0.0.1", free_port()),
        staging=staging,
        **options,
    )
    first = dict(results[0])
    first["ranks"] = [results[r] for r in sorted(results)]
    return first
