"""DcpCheckpointer in a one-rank process group: what it commits does not depend on the
Metadata object DCP's save returns (on an H200 with torch 2.11 async_save returned one
without storage_data; scripts/gpu_train_check.py found it), only on the files DCP wrote."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from gpuflow.tasks.training.checkpoint import CheckpointManager
from gpuflow.tasks.training.distributed import checkpoint as dcp_checkpoint
from gpuflow.tasks.training.distributed.checkpoint import DcpCheckpointer
from gpuflow.tasks.training.loop import build_workload
from gpuflow.tasks.training.spec import TrainSpec
from gpuflow.tasks.training.storage import LocalStorage


@pytest.fixture
def one_rank_group(tmp_path: Path):
    store = dist.FileStore(str(tmp_path / "pg-store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist.new_group(backend="gloo")
    finally:
        dist.destroy_process_group()


def _without_storage_data(save):
    """DCP's save (or async_save), its Metadata stripped of storage_data as seen on the H200;
    the files it writes, .metadata included, unchanged."""

    def strip(metadata):
        return dataclasses.replace(metadata, storage_data=None)

    def wrapped(*args, **kwargs):
        result = save(*args, **kwargs)
        if hasattr(result, "add_done_callback"):  # async_save: a Future of the Metadata
            stripped = type(result)()
            result.add_done_callback(
                lambda f: (
                    stripped.set_exception(f.exception())
                    if f.exception()
                    else stripped.set_result(strip(f.result()))
                )
            )
            return stripped
        return strip(result)

    return wrapped


def test_async_and_blocking_saves_commit_from_the_files_dcp_wrote(
    one_rank_group, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(dcp_checkpoint.dcp, "save", _without_storage_data(dcp_checkpoint.dcp.save))
    monkeypatch.setattr(
        dcp_checkpoint.dcp, "async_save", _without_storage_data(dcp_checkpoint.dcp.async_save)
    )
    spec = TrainSpec(job_id="dcp-meta", model="byte-lm", steps=2, batch_size=4, precision="fp32")
    w = build_workload(spec, torch.device("cpu"))
    manager = CheckpointManager(LocalStorage(tmp_path / "ck"), "dcp-meta")
    commits: list[tuple[str, int]] = []
    ckpt = DcpCheckpointer(
        manager, tmp_path / "staging", 0, one_rank_group, lambda c, s: commits.append((c, s))
    )

    first = ckpt.save(w, 1, {}, blocking=False)
    ckpt.flush()
    last = ckpt.save(w, 2, {}, blocking=True)

    assert commits == [(first, 1), (last, 2)]
    assert [c.checkpoint_id for c in manager.list()] == [first, last]
    fresh = build_workload(spec, torch.device("cpu"))
    with torch.no_grad():
        for p in fresh.model.parameters():
            p.zero_()
    assert ckpt.restore(fresh) == (last, 2)
    for a, b in zip(w.model.state_dict().values(), fresh.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
