"""A gang's checkpoints: torch.distributed.checkpoint (DCP) under the project's manifest.

Each rank writes its own shards of the model and optimizer with DCP into a staging folder
(``async_save`` for periodic checkpoints: training stalls only for the staging copy; a
checkpoint asked for on request, and the last one, are written synchronously). Rank 0
adds the small replicated part (precision, sampler, RNG, step: tasks/training/state.py),
then commits the folder through CheckpointManager.commit_files: every file hashed into
the sha256 manifest with the writer's fencing token, the manifest written last. An async
save is committed as soon as its write is done (on the writer's thread); the next save
and the end of the loop wait for that (``flush``). A gang that dies before the commit
resumes from the checkpoint before it.

Restore is resharding by construction: DCP loads into whatever layout this run has, so a
checkpoint written by N ranks resumes on M. A checkpoint of a one-process run (torch
files) resumes a gang too.

Staging is one folder all ranks of a node see (this machine's GPUFLOW_HOME); a gang spans
one node here (docs/distributed.md).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from gpuflow.tasks.training.checkpoint import (
    LAYOUT_DCP,
    CheckpointCorruptError,
    CheckpointManager,
    ModelMismatchError,
    checkpoint_id_for,
)
from gpuflow.tasks.training.parallel import OnCommit
from gpuflow.tasks.training.state import MODEL, OPTIMIZER, extra_state, restore_extra, restore_full
from gpuflow.tasks.training.storage import StorageError
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

if TYPE_CHECKING:
    from gpuflow.tasks.training.loop import Workload

log = logging.getLogger(__name__)

EXTRA_FILE = "extra.pt"


class DcpCheckpointer:
    """The Checkpointer of one rank of a gang."""

    def __init__(
        self,
        manager: CheckpointManager,
        staging: Path,
        rank: int,
        async_group: Any,
        on_commit: OnCommit | None,
    ) -> None:
        self.manager, self.staging, self.rank = manager, staging, rank
        self.async_group = async_group  # gloo: async writes never share the training group
        self.on_commit = on_commit
        # A restarted gang (torchelastic's restart count) never reuses a dead one's folder.
        self._generation = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
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
            self._commit(cid, step, folder, meta)
        else:
            committed = threading.Event()
            errors: list[BaseException] = []

            def commit_when_written(done: Future) -> None:
                try:
                    done.result()
                    self._commit(cid, step, folder, meta)
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

    def _commit(self, cid: str, step: int, folder: Path, meta: dict[str, Any]) -> None:
        # Rank 0's write returns once every rank's shards are written (DCP gathers their
        # results before it writes .metadata): the folder is complete here.
        if self.rank != 0:
            return
        paths = {p.name: p for p in folder.iterdir() if p.is_file()}
        self.manager.commit_files(step, paths, meta)
        shutil.rmtree(folder, ignore_errors=True)
        if self.on_commit:
            self.on_commit(cid, step)

    # -- restore --------------------------------------------------------------------------
    def restore(self, w: Workload) -> tuple[str, int] | None:
        """Every rank loads the newest committed checkpoint that verifies (rank 0 fetches
        and checks it, then tells the others where it is)."""
        found = self._fetch_newest() if self.rank == 0 else None
        box = [found]
        dist.broadcast_object_list(box, src=0)
        found = box[0]
        if found is None:
            return None
        cid, layout, folder = found
        if layout != LAYOUT_DCP:  # a one-process checkpoint: every rank loads the same file
            loaded = self.manager.load(cid, expected_model=self.manager.expected_model)
            return cid, restore_full(w, loaded.state)
        state = self._tensors(w)
        dcp.load(state, checkpoint_id=folder)
        set_model_state_dict(w.model, state[MODEL])
        set_optimizer_state_dict(w.model, w.optimizer, state[OPTIMIZER])
        step = restore_extra(w, torch.load(Path(folder) / EXTRA_FILE, weights_only=True))
        dist.barrier()
        if self.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
        return cid, step

    def _fetch_newest(self) -> tuple[str, str, str] | None:
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
                return cid, layout, ""
            folder = self.staging / f"restore-{cid}.gen{self._generation}"
            try:
                self.manager.fetch(cid, folder)
            except (CheckpointCorruptError, StorageError) as exc:
                log.warning("checkpoint %s is unusable and skipped: %s", cid, exc)
                continue
            return cid, layout, str(folder)
        return None


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
            dcp.load(state, checkpoint_id=folder, no_dist=True)
            model.load_state_dict(state[MODEL])
            return cid
        except (CheckpointCorruptError, StorageError) as exc:
            log.warning("checkpoint %s is unusable and skipped: %s", cid, exc)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    raise CheckpointCorruptError(f"job {manager.job_id!r} has no usable gang checkpoint")
