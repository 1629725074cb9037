"""Exact, atomic, verified training checkpoints on any CheckpointStore.

Layout in the store, per job::

    <job_id>/step-000000100/model.<nonce>.pt        one file per top-level state key
    <job_id>/step-000000100/optimizer.<nonce>.pt
    <job_id>/step-000000100/manifest.json           written LAST: the commit point

A checkpoint exists once its manifest exists; the manifest lists every file with its
sha256 and size, so a reader can prove the bytes are the ones that were written. Data
files carry a random nonce, so re-saving a step never touches the files a committed
manifest points to: a crash at any moment leaves every committed checkpoint intact.

Exact resume needs the model, optimizer, scaler, every RNG, the data sampler position and
the precision policy's state (DESIGN.md sec 5): the caller passes them all in ``state``;
``capture_rng_state``/``restore_rng_state`` cover the RNGs.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from gpuflow.tasks.training.guard import refuse_nonfinite_state
from gpuflow.tasks.training.hashing import HashingWriter, hash_pool, sha256_of
from gpuflow.tasks.training.storage import (
    CheckpointStore,
    ObjectNotFoundError,
    StorageError,
    open_store,
)
from torch.utils.serialization import config as torch_serialization_config

if TYPE_CHECKING:
    from gpuflow.blocks.checkpoint_storage import CheckpointStorage

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
# What the files are: one torch.save per state key, or a torch.distributed.checkpoint folder.
LAYOUT_TORCH, LAYOUT_DCP = "torch", "dcp"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_CHECKPOINT_ID = re.compile(r"^step-(\d{9,})$")


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or loaded."""


class CheckpointNotFoundError(CheckpointError):
    """No committed checkpoint with that id."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint's manifest or files do not match (partial write, bit rot, tampering)."""


class ModelMismatchError(CheckpointError):
    """The checkpoint belongs to a different model than the caller expects."""


@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint as its manifest describes it."""

    checkpoint_id: str
    step: int
    created_at: str
    model_name: str | None
    model_fingerprint: str | None
    size_bytes: int


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A verified checkpoint: its state (as passed to ``save``) and its manifest."""

    checkpoint_id: str
    step: int
    state: dict[str, Any]
    manifest: dict[str, Any]

    @property
    def meta(self) -> dict[str, Any]:
        return self.manifest.get("meta", {})


def checkpoint_id_for(step: int) -> str:
    """The id of the checkpoint at ``step``; zero-padded so ids sort like steps."""
    return f"step-{step:09d}"


def model_fingerprint(model: torch.nn.Module) -> str:
    """A sha256 of a model's architecture: class, parameter/buffer names, shapes, dtypes.

    Two models with the same fingerprint can load each other's weights; the weights
    themselves are not part of it (they change every step).
    """
    digest = hashlib.sha256(type(model).__qualname__.encode())
    for name, tensor in model.state_dict().items():
        digest.update(f"|{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
    return digest.hexdigest()


def _json_ready(meta: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(meta, dict):
        raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
    try:
        return json.loads(json.dumps(meta))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"meta must be JSON-serialisable: {exc}") from None


class StaleTokenError(CheckpointError):
    """A save fenced off: the store holds a checkpoint written under a newer lease."""

    def __init__(self, job_id: str, token: int, newest: int, newest_id: str) -> None:
        self.job_id, self.token, self.newest = job_id, token, newest
        super().__init__(
            f"job {job_id!r}: refusing a checkpoint with fencing token {token}: {newest_id} "
            f"was committed with the newer token {newest} (this attempt's lease was taken "
            "over); nothing written"
        )


class CheckpointManager:
    """Save, verify, list, load and prune the checkpoints of one training job.

    ``expected_model`` is the model fingerprint this job trains (see ``model_fingerprint``);
    when given, loading or saving a checkpoint of another model raises ModelMismatchError
    before anything is read into the caller's objects or written to the store.
    ``weights_only`` is passed to torch.load: True (safe) accepts tensors and plain Python
    containers, which is what model/optimizer state and ``capture_rng_state`` produce.
    ``fencing_token`` is the writer's lease token: it is recorded in every manifest, and a
    save whose token is older than the newest committed one raises StaleTokenError.
    """

    def __init__(
        self,
        store: CheckpointStore,
        job_id: str,
        keep_last: int = 3,
        expected_model: str | None = None,
        weights_only: bool = True,
        fencing_token: int | None = None,
    ) -> None:
        if not isinstance(job_id, str) or not _SAFE_NAME.match(job_id):
            raise ValueError(
                f"job_id {job_id!r} must be 1-128 characters of letters, digits, '_', '.', '-'"
            )
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last must be an integer >= 1, got {keep_last!r}")
        self.store = store
        self.job_id = job_id
        self.keep_last = keep_last
        self.expected_model = expected_model
        self.weights_only = weights_only
        if fencing_token is not None and (
            isinstance(fencing_token, bool) or not isinstance(fencing_token, int)
        ):
            raise ValueError(f"fencing_token must be an integer, got {fencing_token!r}")
        self.fencing_token = fencing_token

    def __repr__(self) -> str:
        return (
            f"CheckpointManager(store={self.store!r}, job_id={self.job_id!r}, "
            f"keep_last={self.keep_last})"
        )

    # -- keys ---------------------------------------------------------------------------

    def _key(self, checkpoint_id: str, name: str) -> str:
        return f"{self.job_id}/{checkpoint_id}/{name}"

    def _checkpoint_ids(self) -> dict[str, bool]:
        """Every checkpoint folder of the job -> whether it is committed (has a manifest)."""
        found: dict[str, bool] = {}
        for key in self.store.list(f"{self.job_id}/"):
            parts = key.split("/")
            if len(parts) != 3 or not _CHECKPOINT_ID.match(parts[1]):
                continue
            found[parts[1]] = found.get(parts[1], False) or parts[2] == MANIFEST_NAME
        return dict(sorted(found.items(), key=lambda item: _step_of(item[0])))

    # -- save ---------------------------------------------------------------------------

    def save(self, state: dict[str, Any], step: int, meta: dict[str, Any] | None = None) -> str:
        """Write ``state`` as checkpoint ``step``; return its id. Prunes to ``keep_last``.

        Each top-level key of ``state`` becomes one file (torch.save, hashed while it is
        written). ``meta`` (JSON) may carry ``model_name`` and ``model_fingerprint``.
        """
        _check_step(step)
        if not isinstance(state, dict) or not state:
            raise ValueError(
                "state must be a non-empty dict (e.g. {'model': ..., 'optimizer': ...})"
            )
        for name in state:
            if not isinstance(name, str) or not _SAFE_NAME.match(name) or name == "manifest":
                raise ValueError(
                    f"state key {name!r} must be a name of letters, digits, '_', '.', '-' "
                    "(and not 'manifest'): it becomes a file name"
                )
        meta = _json_ready(meta or {})
        fingerprint = meta.get("model_fingerprint", self.expected_model)
        if self.expected_model is not None and fingerprint not in (None, self.expected_model):
            raise ModelMismatchError(
                f"job {self.job_id!r} expects model {self.expected_model}, "
                f"but save() was given model_fingerprint {fingerprint}; nothing written"
            )
        self.refuse_other_model(fingerprint)
        self._refuse_stale_token()
        refuse_nonfinite_state(state, step)  # keep_last must never rotate good ones out

        checkpoint_id = checkpoint_id_for(step)
        nonce = secrets.token_hex(4)
        files: dict[str, dict[str, Any]] = {}
        for name, value in state.items():
            file_name = f"{name}.{nonce}.pt"
            # The zip CRC32 that torch computes by default costs ~20 % of a save and adds
            # nothing over the sha256 we take of the same bytes. (The switch is global to
            # torch while it is set.)
            with (
                torch_serialization_config.patch({"save.compute_crc32": False}),
                self.store.open_write(self._key(checkpoint_id, file_name)) as handle,
            ):
                writer = HashingWriter(handle, hash_pool())
                torch.save(value, writer)
            files[name] = {
                "file": file_name,
                "sha256": writer.sha256.hexdigest(),
                "size_bytes": writer.size_bytes,
            }

        return self._commit(checkpoint_id, step, files, meta, fingerprint, LAYOUT_TORCH)

    def commit_files(
        self, step: int, paths: dict[str, Path], meta: dict[str, Any] | None = None
    ) -> str:
        """Commit files someone else wrote (a torch.distributed.checkpoint folder) as
        checkpoint ``step``: each is uploaded under a nonce and hashed (``upload_file``),
        then the manifest (layout "dcp") is written last (``commit_manifest``), exactly as
        ``save`` commits. ``paths`` maps the name a file must have when fetched back
        (``.metadata``, ``__0_0.distcp``...) to where it is now."""
        _check_step(step)
        if not paths:
            raise ValueError("commit_files needs at least one file")
        # Refused before a byte is uploaded (commit_manifest checks again before it commits).
        self.refuse_other_model(
            _json_ready(meta or {}).get("model_fingerprint", self.expected_model)
        )
        self._refuse_stale_token()
        files = {name: self.upload_file(step, name, path) for name, path in paths.items()}
        return self.commit_manifest(step, files, meta)

    def upload_file(self, step: int, name: str, path: Path) -> dict[str, Any]:
        """Upload one file of the uncommitted checkpoint ``step`` under a fresh nonce and
        return its manifest entry (sha256, size): what each rank of a gang does with its
        own shards, on whichever node it runs; ``commit_manifest`` commits the entries."""
        _check_step(step)
        if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
            raise ValueError(f"file name {name!r} must be a plain name (no '/')")
        # The name's letters for a reader of the store, a nonce so that every upload
        # (any rank, any re-save of the step) gets a key no committed manifest points to.
        stem = re.sub(r"[^A-Za-z0-9_.-]", "", name).strip("._-")[:64] or "part"
        file_name = f"{stem}.{secrets.token_hex(6)}.bin"
        digest, size = sha256_of(path)
        self.store.put_file(self._key(checkpoint_id_for(step), file_name), path)
        return {"file": file_name, "sha256": digest, "size_bytes": size}

    def commit_manifest(
        self, step: int, files: dict[str, dict[str, Any]], meta: dict[str, Any] | None = None
    ) -> str:
        """Commit the uploaded ``files`` (name -> ``upload_file``'s entry) as checkpoint
        ``step`` (layout "dcp"): the manifest, with the fencing token, written last."""
        _check_step(step)
        if not files:
            raise ValueError("commit_manifest needs at least one file")
        meta = _json_ready(meta or {})
        fingerprint = meta.get("model_fingerprint", self.expected_model)
        self.refuse_other_model(fingerprint)
        self._refuse_stale_token()
        return self._commit(checkpoint_id_for(step), step, files, meta, fingerprint, LAYOUT_DCP)

    def fetch(self, checkpoint_id: str, dest: Path) -> dict[str, Any]:
        """Download a committed checkpoint's files into ``dest`` under their names,
        verifying each against the manifest; returns the manifest."""
        manifest = self._read_manifest_or_none(checkpoint_id)
        if manifest is None:
            raise CheckpointNotFoundError(
                f"job {self.job_id!r} has no checkpoint {checkpoint_id!r}"
            )
        where = f"{self.job_id}/{checkpoint_id}"
        dest.mkdir(parents=True, exist_ok=True)
        for name, entry in (manifest.get("files") or {}).items():
            if "/" in name or name in ("", ".", ".."):
                raise CheckpointCorruptError(f"manifest of {where} names a file {name!r}")
            target = dest / name
            try:
                self.store.get_file(self._key(checkpoint_id, str(entry["file"])), target)
            except ObjectNotFoundError:
                raise CheckpointCorruptError(f"{where}: file {entry['file']} is missing") from None
            digest, size = sha256_of(target)
            if size != entry["size_bytes"] or digest != entry["sha256"]:
                raise CheckpointCorruptError(
                    f"{where}: file {entry['file']} does not match its manifest entry"
                )
        return manifest

    def committed(self) -> list[tuple[str, dict[str, Any]]]:
        """(checkpoint id, manifest) of every committed checkpoint, newest first."""
        out = []
        for cid, done in reversed(self._checkpoint_ids().items()):
            manifest = self._read_manifest_or_none(cid) if done else None
            if manifest:
                out.append((cid, manifest))
        return out

    def _commit(
        self,
        checkpoint_id: str,
        step: int,
        files: dict[str, dict[str, Any]],
        meta: dict[str, Any],
        fingerprint: str | None,
        layout: str,
    ) -> str:
        manifest_key = self._key(checkpoint_id, MANIFEST_NAME)
        replaced = self._read_manifest_or_none(checkpoint_id)
        manifest = {
            "format": MANIFEST_FORMAT,
            "job_id": self.job_id,
            "checkpoint_id": checkpoint_id,
            "step": step,
            "created_at": datetime.now(UTC).isoformat(),
            "model_name": meta.get("model_name"),
            "model_fingerprint": fingerprint,
            "meta": meta,
            "files": files,
            "fencing_token": self.fencing_token,
            "layout": layout,
        }
        # Again just before the commit: a newer attempt may have committed meanwhile.
        self._refuse_stale_token()
        # The commit point: before this line the checkpoint does not exist.
        self.store.put_bytes(manifest_key, json.dumps(manifest, indent=1).encode())

        if replaced is not None:  # a re-save of the same step: its old files are garbage now
            keep = {entry["file"] for entry in files.values()}
            for entry in replaced.get("files", {}).values():
                if isinstance(entry, dict) and entry.get("file") not in keep:
                    self.store.delete(self._key(checkpoint_id, str(entry.get("file"))))
        self.prune(protect=checkpoint_id)
        newer = [
            cid for cid, done in self._checkpoint_ids().items() if done and _step_of(cid) > step
        ]
        if newer:
            log.warning(
                "job %s saved %s but holds newer checkpoints %s (an earlier timeline?); "
                "latest() prefers the newest that verifies",
                self.job_id,
                checkpoint_id,
                newer,
            )
        return checkpoint_id

    def refuse_other_model(self, fingerprint: str | None) -> None:
        if fingerprint is None:
            return
        committed = [cid for cid, done in self._checkpoint_ids().items() if done]
        if not committed:
            return
        newest = self._read_manifest_or_none(committed[-1])
        theirs = newest.get("model_fingerprint") if newest else None
        if theirs is not None and theirs != fingerprint:
            raise ModelMismatchError(
                f"job {self.job_id!r} holds checkpoints of model {theirs} "
                f"(newest {committed[-1]}), not {fingerprint}; nothing written. "
                "Use another job_id or delete the old checkpoints."
            )

    def newest_token(self) -> tuple[int, str] | None:
        """(the largest fencing token among committed checkpoints, its checkpoint id)."""
        best: tuple[int, str] | None = None
        for cid, done in self._checkpoint_ids().items():
            if not done:
                continue
            token = (self._read_manifest_or_none(cid) or {}).get("fencing_token")
            if isinstance(token, int) and (best is None or token > best[0]):
                best = (token, cid)
        return best

    def _refuse_stale_token(self) -> None:
        if self.fencing_token is None:
            return
        newest = self.newest_token()
        if newest is not None and newest[0] > self.fencing_token:
            raise StaleTokenError(self.job_id, self.fencing_token, newest[0], newest[1])

    def prune(self, protect: str | None = None) -> list[str]:
        """Keep the newest ``keep_last`` committed checkpoints; return the ids removed.

        Uncommitted folders (a crashed save) older than the newest committed checkpoint are
        removed too; a newer one may be a save in progress and is left alone. ``protect``
        (the checkpoint just saved) is never removed, even when newer ones exist.
        """
        ids = self._checkpoint_ids()
        committed = [cid for cid, done in ids.items() if done]
        doomed = committed[: max(0, len(committed) - self.keep_last)]
        if committed:
            newest_step = _step_of(committed[-1])
            doomed += [cid for cid, done in ids.items() if not done and _step_of(cid) < newest_step]
        doomed = [cid for cid in doomed if cid != protect]
        for cid in doomed:
            keys = self.store.list(f"{self.job_id}/{cid}/")
            manifest = self._key(cid, MANIFEST_NAME)
            # Manifest first: a crash half-way leaves an uncommitted folder, never a
            # manifest that points at deleted files.
            if manifest in keys:
                self.store.delete(manifest)
            for key in keys:
                if key != manifest:
                    self.store.delete(key)
        return sorted(doomed, key=_step_of)

    # -- read ---------------------------------------------------------------------------

    def _read_manifest_or_none(self, checkpoint_id: str) -> dict[str, Any] | None:
        try:
            raw = self.store.get_bytes(self._key(checkpoint_id, MANIFEST_NAME))
        except ObjectNotFoundError:
            return None
        try:
            manifest = json.loads(raw)
        except ValueError:
            return {}
        return manifest if isinstance(manifest, dict) else {}

    def list(self) -> list[CheckpointInfo]:
        """Committed checkpoints, oldest first (manifests only; files are not verified)."""
        infos: list[CheckpointInfo] = []
        for cid, done in self._checkpoint_ids().items():
            if not done:
                continue
            manifest = self._read_manifest_or_none(cid) or {}
            files = manifest.get("files") or {}
            infos.append(
                CheckpointInfo(
                    checkpoint_id=cid,
                    step=_step_of(cid),
                    created_at=str(manifest.get("created_at", "")),
                    model_name=manifest.get("model_name"),
                    model_fingerprint=manifest.get("model_fingerprint"),
                    size_bytes=sum(
                        int(e.get("size_bytes", 0)) for e in files.values() if isinstance(e, dict)
                    ),
                )
            )
        return infos

    def load(
        self,
        checkpoint_id: str,
        expected_model: str | None = None,
        map_location: str | torch.device | None = "cpu",
    ) -> LoadedCheckpoint:
        """Load and verify one checkpoint; raise if it is missing, corrupt or another model's."""
        if not isinstance(checkpoint_id, str) or not _CHECKPOINT_ID.match(checkpoint_id):
            raise ValueError(f"checkpoint id {checkpoint_id!r} is not of the form 'step-000000123'")
        manifest = self._read_manifest_or_none(checkpoint_id)
        if manifest is None:
            raise CheckpointNotFoundError(
                f"job {self.job_id!r} has no committed checkpoint {checkpoint_id!r} "
                f"in {self.store!r}"
            )
        return self._verified(checkpoint_id, manifest, expected_model, map_location)

    def latest(
        self,
        expected_model: str | None = None,
        map_location: str | torch.device | None = "cpu",
    ) -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies; corrupt or partial newer ones are skipped
        with a warning. None when the job has no usable checkpoint."""
        for cid, done in reversed(self._checkpoint_ids().items()):
            if not done:
                log.warning(
                    "checkpoint %s/%s has no manifest (partial or crashed save); skipped",
                    self.job_id,
                    cid,
                )
                continue
            manifest = self._read_manifest_or_none(cid)
            if manifest is None:  # deleted between list and read
                continue
            try:
                return self._verified(cid, manifest, expected_model, map_location)
            except (CheckpointCorruptError, StorageError) as exc:
                log.warning("checkpoint %s/%s is unusable and skipped: %s", self.job_id, cid, exc)
        return None

    def _verified(
        self,
        checkpoint_id: str,
        manifest: dict[str, Any],
        expected_model: str | None,
        map_location: str | torch.device | None,
    ) -> LoadedCheckpoint:
        where = f"{self.job_id}/{checkpoint_id}"
        files = manifest.get("files")
        if (
            manifest.get("format") != MANIFEST_FORMAT
            or manifest.get("job_id") != self.job_id
            or manifest.get("checkpoint_id") != checkpoint_id
            or manifest.get("step") != _step_of(checkpoint_id)
            or not isinstance(files, dict)
            or not files
        ):
            raise CheckpointCorruptError(f"manifest of {where} is malformed or belongs elsewhere")

        if manifest.get("layout", LAYOUT_TORCH) != LAYOUT_TORCH:
            raise CheckpointError(
                f"checkpoint {where} was written by a gang (torch.distributed.checkpoint): "
                "resume the job as a gang (`gpuflow train --gpus N`, any N)"
            )
        expected = expected_model if expected_model is not None else self.expected_model
        theirs = manifest.get("model_fingerprint")
        if expected is not None and theirs != expected:
            raise ModelMismatchError(
                f"checkpoint {where} is of model {theirs} "
                f"({manifest.get('model_name')!r}), expected {expected}; nothing loaded"
            )

        state: dict[str, Any] = {}
        for name, entry in files.items():
            if not isinstance(entry, dict) or not {"file", "sha256", "size_bytes"} <= entry.keys():
                raise CheckpointCorruptError(f"manifest of {where} has a malformed entry {name!r}")
            key = self._key(checkpoint_id, str(entry["file"]))
            try:
                data = self.store.get_bytes(key)
            except ObjectNotFoundError:
                raise CheckpointCorruptError(f"{where}: file {entry['file']} is missing") from None
            if len(data) != entry["size_bytes"]:
                raise CheckpointCorruptError(
                    f"{where}: file {entry['file']} has {len(data)} bytes, "
                    f"the manifest says {entry['size_bytes']}"
                )
            digest = hashlib.sha256(data).hexdigest()
            if digest != entry["sha256"]:
                raise CheckpointCorruptError(
                    f"{where}: file {entry['file']} sha256 {digest} != manifest {entry['sha256']}"
                )
            try:
                state[name] = torch.load(
                    io.BytesIO(data), map_location=map_location, weights_only=self.weights_only
                )
            except Exception as exc:  # verified bytes that torch cannot read: wrong writer
                raise CheckpointCorruptError(
                    f"{where}: file {entry['file']} does not load: {exc}"
                ) from exc
        return LoadedCheckpoint(
            checkpoint_id=checkpoint_id,
            step=_step_of(checkpoint_id),
            state=state,
            manifest=manifest,
        )


def _check_step(step: Any) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")


def _step_of(checkpoint_id: str) -> int:
    match = _CHECKPOINT_ID.match(checkpoint_id)
    if not match:
        raise ValueError(f"not a checkpoint id: {checkpoint_id!r}")
    return int(match.group(1))


def checkpoint_manager(
    config: CheckpointStorage, job_id: str, expected_model: str | None = None
) -> CheckpointManager:
    """A CheckpointManager for ``job_id`` on the store ``config`` names (checking an S3
    store now), keeping the block's ``keep_last``."""
    return CheckpointManager(
        open_store(config), job_id, keep_last=config.keep_last, expected_model=expected_model
    )
