"""A gang's checkpoints: torch.distributed.checkpoint (DCP) under the project's manifest.

Each rank writes its own shards of the model and optimizer with DCP into its node's
staging folder (``async_save`` for periodic checkpoints: training stalls only for the
staging copy; a checkpoint asked for on request, and the last one, are written
synchronously). No rank relies on another node's files: each uploads the shard files it
wrote itself (CheckpointManager.upload_file: stored under a nonce, hashed), and the
manifest entries reach rank 0 by an all-gather on the checkpoint group. Rank 0 adds the
small replicated part (precision, sampler, RNG, step: tasks/training/state.py) and DCP's
``.metadata``, checks that the entries cover every file ``.metadata`` refers to, and
commits (CheckpointManager.commit_manifest: the sha256 manifest with the writer's
fencing token, written last). An async save is uploaded and committed as soon as its
write is done (on the writer's thread); the next save and the end of the loop wait for
that (``flush``). A gang that dies before the commit resumes from the checkpoint before
it.

Restore is resharding by construction: DCP loads into whatever layout this run has, so a
checkpoint written by N ranks resumes on M, and one written by DDP ranks (whole tensors)
resumes FSDP2 ranks (DTensor shards) and back: the state dicts are keyed by parameter
name either way (torch.distributed.checkpoint.state_dict). The parallelism unit lays the
workload out first (``prepare``: FSDP2 shards the model there), so each rank reads only
its part. A checkpoint of a one-process run (torch files) resumes a gang too. Rank 0
picks the newest checkpoint that verifies; the first rank of every other node fetches it
into its own node's staging folder (verified against the manifest again), then all load.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from gpuflow.tasks.training.checkpoint import (
    LAYOUT_DCP,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointManager,
    ModelMismatchError,
    checkpoint_id_for,
)
from gpuflow.tasks.training.parallel import OnCommit
from gpuflow.tasks.training.state import MODEL, OPTIMIZER, extra_state, restore_extra
from gpuflow.tasks.training.storage import StorageError
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

if TYPE_CHECKING:
    from gpuflow.tasks.training.loop import Workload

log = logging.getLogger(__name__)

EXTRA_FILE = "extra.pt"
METADATA_FILE = ".metadata"  # DCP's, written by the coordinator (rank 0)


class DcpCheckpointer:
    """The Checkpointer of one rank of a gang."""

    def __init__(
        self,
        manager: CheckpointManager,
        staging: Path,
        rank: int,
        async_group: Any,
        on_commit: OnCommit | None,
        prepare: Callable[[Workload], None] | None = None,
    ) -> None:
        self.manager, self.staging, self.rank = manager, staging, rank
        # gloo, checkpoints only: async writes, and the uploads' all-gather on the writer's
        # thread, never share the training group (whose collectives run meanwhile).
        self.async_group = async_group
        self.on_commit = on_commit
        self.prepare = prepare  # the parallelism unit's layout, before anything is loaded
        # The first rank of each node fetches for its node (torchelastic's LOCAL_RANK; a
        # process group started without it is taken for one node, rank 0 its first).
        self.node_first = int(os.environ.get("LOCAL_RANK", rank)) == 0
        # A restarted gang (torchelastic's restart count) never reuses a dead one's folder,
        # and two nodes sharing a staging file system (GROUP_RANK: the node's rank) never
        # write or fetch into one folder.
        self._generation = (
            f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
            f".node{os.environ.get('GROUP_RANK', '0')}"
        )
        self._pending: tuple[threading.Event, list[BaseException]] | None = None
        self.stalls_s: list[float] = []  # how long each save held training up

    # -- save -----------------------------------------------------------------------------
    def _tensors(self, w: Workload) -> dict[str, Any]:
        return {
            MODEL: get_model_state_dict(w.model),
            OPTIMIZER: get_optimizer_state_dict(w.model, w.optimizer),
        }

    def save(self, w: Workload, step: int, meta: dict[str, Any], *, blocking: bool) -> str:
        self.flush()
        cid = checkpoint_id_for(step)
        folder = self.staging / f"{cid}.gen{self._generation}"
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        state = self._tensors(w)
        if blocking:
            dcp.save(state, checkpoint_id=folder)
        else:
            future = dcp.async_save(state, checkpoint_id=folder, process_group=self.async_group)
        self.stalls_s.append(time.perf_counter() - started)
        if self.rank == 0:
            torch.save(extra_state(w, step), folder / EXTRA_FILE)
        if blocking:
            self._commit(step, folder, meta)
        else:
            committed = threading.Event()
            errors: list[BaseException] = []

            # The upload and its all-gather run here, on the writer's thread (or on this
            # one, if the write is already done): every rank runs it once per save, after
            # its own write and before any later checkpoint collective (``flush`` comes
            # first), on the checkpoint group alone; so the ranks' calls pair up, and the
            # training group's collectives meanwhile are another group's.
            def commit_when_written(done: Future) -> None:
                try:
                    done.result()  # the save's own error, if any, first
                    self._commit(step, folder, meta)
                except BaseException as exc:  # noqa: BLE001 - re-raised by flush()
                    errors.append(exc)
                finally:
                    committed.set()

            future.add_done_callback(commit_when_written)
            self._pending = (committed, errors)
        return cid

    def flush(self) -> None:
        """Wait until the async save in flight is committed (its error raises here)."""
        if self._pending is None:
            return
        committed, errors = self._pending
        self._pending = None
        committed.wait()
        if errors:
            raise errors[0]

    def _commit(self, step: int, folder: Path, meta: dict[str, Any]) -> None:
        """Every rank uploads the files it wrote; rank 0 commits them all, checked against
        the list in DCP's .metadata. Called once the save returned on every rank: DCP
        writes .metadata (rank 0's folder) after every rank's shards are written, so the
        files are complete on their nodes.

        The lists come from the files, not from the Metadata that save returns: on an
        H200 with torch 2.11 (scripts/gpu_train_check.py) async_save's Metadata came back
        without storage_data. .metadata is what a load reads: it is the list of record."""
        shards: list[str] = []
        entries: dict[str, dict[str, Any]] | str
        try:
            mine = sorted(p.name for p in folder.glob(f"__{self.rank}_*"))  # DCP's prefix
            if self.rank == 0:
                written = FileSystemReader(folder).read_metadata()
                shards = sorted({info.relative_path for info in written.storage_data.values()})
                mine += [METADATA_FILE, EXTRA_FILE]
            entries = {n: self.manager.upload_file(step, n, folder / n) for n in mine}
        except Exception as exc:  # noqa: BLE001 - any failure still joins the gather below,
            entries = f"{type(exc).__name__}: {exc}"  # or every other rank would hang in it
        gathered: list[Any] = [None] * dist.get_world_size(self.async_group)
        dist.all_gather_object(gathered, entries, group=self.async_group)
        if isinstance(entries, str):
            raise CheckpointError(f"rank {self.rank} could not upload its shards: {entries}")
        # Every rank's upload is done: this node's folder is no one's any more (rank 0
        # still commits from memory).
        shutil.rmtree(folder, ignore_errors=True)
        if self.rank != 0:
            return
        failed = {r: e for r, e in enumerate(gathered) if isinstance(e, str)}
        if failed:
            raise CheckpointError(
                f"step {step}: ranks' uploads failed, nothing committed: {failed}"
            )
        files = {name: entry for part in gathered for name, entry in part.items()}
        missing = sorted(set(shards) - set(files))
        if missing:
            raise CheckpointError(f"step {step}: no rank uploaded {missing}; nothing committed")
        cid = self.manager.commit_manifest(step, files, meta)
        if self.on_commit:
            self.on_commit(cid, step)

    # -- restore --------------------------------------------------------------------------
    def restore(self, w: Workload) -> tuple[str, int] | None:
        """Every rank loads the newest committed checkpoint that verifies: rank 0 finds
        and fetches it, every other node's first rank fetches it too, then all load."""
        if self.prepare is not None:
            self.prepare(w)  # a sharded model loads its shards, not the whole model
        found = self._fetch_newest() if self.rank == 0 else None
        box = [found]
        dist.broadcast_object_list(box, src=0)
        found = box[0]
        if found is None:
            return None
        cid, layout = found
        if layout != LAYOUT_DCP:  # a one-process checkpoint: every rank loads the same file
            loaded = self.manager.load(cid, expected_model=self.manager.expected_model)
            return cid, _restore_whole(w, loaded.state)
        folder = self._restore_folder(cid)
        error = None
        if self.node_first and self.rank != 0:
            try:
                self.manager.fetch(cid, folder)
            except (CheckpointCorruptError, StorageError, OSError) as exc:
                error = f"{type(exc).__name__}: {exc}"
        # Also the barrier: no rank reads before its node's copy is complete.
        errors: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
        failed = {r: e for r, e in enumerate(errors) if e is not None}
        if failed:
            raise CheckpointCorruptError(
                f"checkpoint {self.manager.job_id}/{cid} verified on rank 0 but not on "
                f"other nodes: {failed}"
            )
        state = self._tensors(w)
        dcp.load(state, checkpoint_id=folder)
        set_model_state_dict(w.model, state[MODEL])
        set_optimizer_state_dict(w.model, w.optimizer, state[OPTIMIZER])
        step = restore_extra(w, torch.load(folder / EXTRA_FILE, weights_only=True))
        dist.barrier()
        if self.node_first:
            shutil.rmtree(folder, ignore_errors=True)
        return cid, step

    def _restore_folder(self, cid: str) -> Path:
        return self.staging / f"restore-{cid}.gen{self._generation}"

    def _fetch_newest(self) -> tuple[str, str] | None:
        expected = self.manager.expected_model
        for cid, manifest in self.manager.committed():
            theirs = manifest.get("model_fingerprint")
            if expected is not None and theirs not in (None, expected):
                raise ModelMismatchError(
                    f"checkpoint {self.manager.job_id}/{cid} is of model {theirs}, "
                    f"expected {expected}; nothing loaded"
                )
            layout = manifest.get("layout", "torch")
            if layout != LAYOUT_DCP:
                return cid, layout
            try:
                self.manager.fetch(cid, self._restore_folder(cid))
            except (CheckpointCorruptError, StorageError) as exc:
                log.warning("checkpoint %s is unusable and skipped: %s", cid, exc)
                continue
            return cid, layout
        return None


def _restore_whole(w: Workload, state: dict[str, Any]) -> int:
    """Restore a one-process checkpoint (whole tensors, the optimizer's parameters by
    index) into this rank's layout: the state-dict API keeps this rank's part of each
    tensor (all of it under DDP, its shard under FSDP2)."""
    whole = StateDictOptions(full_state_dict=True)
    set_model_state_dict(w.model, state[MODEL], options=whole)
    optim = _by_name(w.model, w.optimizer, state[OPTIMIZER])
    set_optimizer_state_dict(w.model, w.optimizer, optim, options=whole)
    return restore_extra(w, state)


def _by_name(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, native: dict[str, Any]
) -> dict[str, Any]:
    """``optimizer.state_dict()`` (parameters numbered in param-group order) keyed by
    parameter name instead, the form set_optimizer_state_dict takes."""
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    return {
        "state": {order[i]: value for i, value in native["state"].items()},
        "param_groups": [
            {**group, "params": [order[i] for i in group["params"]]}
            for group in native["param_groups"]
        ],
    }


def load_model_weights(manager: CheckpointManager, model: torch.nn.Module, scratch: Path) -> str:
    """Put the newest committed gang checkpoint's weights into ``model`` (one process, no
    process group: DCP reads all shards); returns its id."""
    for cid, manifest in manager.committed():
        if manifest.get("layout") != LAYOUT_DCP:
            continue
        folder = scratch / f"weights-{cid}"
        try:
            manager.fetch(cid, folder)
            state = {MODEL: model.state_dict()}
            with warnings.catch_warnings():
                # DCP warns that it "assumes" one process even when no_dist=True says so.
                warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
                dcp.load(state, checkpoint_id=folder, no_dist=True)
            model.load_state_dict(state[MODEL])
            return cid
        except (CheckpointCorruptError, StorageError) as exc:
            log.warning("checkpoint %s is unusable and skipped: %s", cid, exc)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    raise CheckpointCorruptError(f"job {manager.job_id!r} has no usable gang checkpoint")
