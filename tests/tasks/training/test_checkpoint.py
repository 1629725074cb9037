"""CheckpointManager: exact round trips, the manifest as commit point, verification, pruning."""

from __future__ import annotations

import hashlib
import json
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gpuflow.tasks.training.checkpoint import (
    MANIFEST_NAME,
    CheckpointCorruptError,
    CheckpointManager,
    CheckpointNotFoundError,
    ModelMismatchError,
    StaleTokenError,
    checkpoint_id_for,
    model_fingerprint,
)
from gpuflow.tasks.training.rng import capture_rng_state, restore_rng_state
from gpuflow.tasks.training.storage import LocalStorage, S3Storage

from gpuflow.bench.checkpoint_bench import measure_checkpoint_throughput

LOGGER = "gpuflow.tasks.training.checkpoint"


class TinyNet(torch.nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(8, width)
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, 4)
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += x.shape[0]
        return self.head(torch.relu(self.norm(self.embed(x))))


def train_steps(model: TinyNet, optimizer: torch.optim.Optimizer, steps: int) -> list[float]:
    """Steps that draw from every global RNG, so a resume is exact only if all are restored."""
    losses = []
    for _ in range(steps):
        noise = float(np.random.rand()) + random.random()
        x = torch.randn(4, 8) * (1 + noise)
        loss = torch.nn.functional.dropout(model(x), p=0.2).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def full_state(model: TinyNet, optimizer: torch.optim.Optimizer, position: int) -> dict[str, Any]:
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "rng": capture_rng_state(),
        "sampler": {"epoch": 2, "position": position},
        "precision": {"dtype": "bf16", "dwell_steps": 7},
    }


def meta_for(model: torch.nn.Module) -> dict[str, Any]:
    return {"model_name": "tiny", "model_fingerprint": model_fingerprint(model), "lr": 1e-3}


@pytest.fixture
def store(tmp_path: Path) -> LocalStorage:
    return LocalStorage(tmp_path / "checkpoints")


def save_steps(manager: CheckpointManager, steps: list[int], model: TinyNet | None = None) -> None:
    model = model or TinyNet()
    for step in steps:
        manager.save(
            {"model": model.state_dict(), "sampler": {"position": step}}, step, meta_for(model)
        )


# -- exact round trip -----------------------------------------------------------------------


def test_round_trip_resumes_bit_exact(store: LocalStorage) -> None:
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    model = TinyNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_steps(model, optimizer, 3)
    manager = CheckpointManager(store, "job-1")
    state = full_state(model, optimizer, position=3)
    checkpoint_id = manager.save(state, step=3, meta=meta_for(model))
    assert checkpoint_id == "step-000000003"
    # state_dict() tensors share the live parameters' storage: snapshot before training on.
    weights_at_save = {name: t.clone() for name, t in state["model"].items()}
    expected_losses = train_steps(model, optimizer, 4)  # the run that was not interrupted

    # A new process: fresh objects, scrambled RNGs, then resume.
    torch.manual_seed(123)
    np.random.seed(123)
    random.seed(123)
    loaded = CheckpointManager(store, "job-1", expected_model=model_fingerprint(TinyNet())).latest()
    assert loaded is not None and loaded.step == 3 and loaded.checkpoint_id == checkpoint_id
    resumed = TinyNet()
    resumed_optimizer = torch.optim.AdamW(resumed.parameters(), lr=1e-2)
    resumed.load_state_dict(loaded.state["model"])
    resumed_optimizer.load_state_dict(loaded.state["optimizer"])
    restore_rng_state(loaded.state["rng"])

    for name, tensor in weights_at_save.items():
        assert torch.equal(loaded.state["model"][name], tensor)
    assert loaded.state["scaler"] == state["scaler"]
    assert loaded.state["sampler"] == {"epoch": 2, "position": 3}
    assert loaded.state["precision"] == {"dtype": "bf16", "dwell_steps": 7}
    assert loaded.meta["lr"] == 1e-3
    assert train_steps(resumed, resumed_optimizer, 4) == expected_losses  # exact, not close
    for a, b in zip(resumed.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_saved_tensors_are_bit_exact(store: LocalStorage) -> None:
    model = TinyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_steps(model, optimizer, 2)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    manager = CheckpointManager(store, "exact")
    manager.save(state, 2, {})
    loaded = manager.load("step-000000002")
    for name, tensor in state["model"].items():
        assert torch.equal(loaded.state["model"][name], tensor)
        assert loaded.state["model"][name].dtype == tensor.dtype
    for key, entry in state["optimizer"]["state"].items():
        assert torch.equal(
            loaded.state["optimizer"]["state"][key]["momentum_buffer"], entry["momentum_buffer"]
        )


def test_rng_capture_restore_replays_every_generator() -> None:
    saved = capture_rng_state()
    first = (random.random(), float(np.random.rand()), np.random.randn(), torch.rand(3))
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    restore_rng_state(saved)
    again = (random.random(), float(np.random.rand()), np.random.randn(), torch.rand(3))
    assert first[:3] == again[:3]
    assert torch.equal(first[3], again[3])
    with pytest.raises(ValueError, match="lacks"):
        restore_rng_state({"python": saved["python"]})


# -- the manifest is the commit point -------------------------------------------------------


class RecordingStore(LocalStorage):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.writes: list[str] = []

    def open_write(self, key: str):
        self.writes.append(key)
        return super().open_write(key)

    def put_bytes(self, key: str, data) -> None:  # type: ignore[override]
        self.writes.append(key)
        with super().open_write(key) as handle:
            handle.write(bytes(data))


def test_manifest_written_last_and_describes_every_file(tmp_path: Path) -> None:
    store = RecordingStore(tmp_path / "rec")
    manager = CheckpointManager(store, "job")
    model = TinyNet()
    manager.save({"model": model.state_dict(), "extra": {"a": 1}}, 7, meta_for(model))
    assert store.writes[-1] == f"job/step-000000007/{MANIFEST_NAME}"
    assert len(store.writes) == 3

    manifest = json.loads(store.get_bytes(f"job/step-000000007/{MANIFEST_NAME}"))
    assert manifest["job_id"] == "job" and manifest["step"] == 7
    assert manifest["model_name"] == "tiny"
    assert manifest["model_fingerprint"] == model_fingerprint(model)
    assert manifest["created_at"].endswith("+00:00")
    assert set(manifest["files"]) == {"model", "extra"}
    for entry in manifest["files"].values():
        data = store.get_bytes(f"job/step-000000007/{entry['file']}")
        assert entry["size_bytes"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()


def test_crash_before_commit_leaves_previous_checkpoint(store: LocalStorage, caplog) -> None:
    manager = CheckpointManager(store, "job")
    save_steps(manager, [10])

    class ManifestFails(LocalStorage):
        def put_bytes(self, key: str, data) -> None:  # type: ignore[override]
            if key.endswith(MANIFEST_NAME):
                raise OSError("power lost")
            super().put_bytes(key, data)

    crashing = CheckpointManager(ManifestFails(store.root), "job")
    with pytest.raises(OSError, match="power lost"):
        save_steps(crashing, [20])
    assert any(k.startswith("job/step-000000020/") for k in store.list("job/"))  # data, no manifest

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        loaded = manager.latest()
    assert loaded is not None and loaded.step == 10
    assert "step-000000020 has no manifest" in caplog.text
    assert [info.step for info in manager.list()] == [10]
    with pytest.raises(CheckpointNotFoundError):
        manager.load("step-000000020")

    # The next good save clears the crashed folder once it is older than the newest commit.
    save_steps(manager, [30])
    assert not any(k.startswith("job/step-000000020/") for k in store.list("job/"))


def test_failure_while_serialising_leaves_nothing_behind(store: LocalStorage) -> None:
    manager = CheckpointManager(store, "job")
    save_steps(manager, [1])
    before = store.list("job/")
    with pytest.raises(Exception, match="lambda|pickle"):
        manager.save({"model": TinyNet().state_dict(), "bad": lambda: 0}, 2, {})
    after = store.list("job/")
    # The model file of step 2 may be there (never committed); step 1 is untouched.
    assert [k for k in after if "step-000000001" in k] == before
    assert not any(k.endswith(f"step-000000002/{MANIFEST_NAME}") for k in after)
    assert not [p for p in store.root.rglob("*") if ".tmp-" in p.name]
    assert manager.latest().step == 1


# -- verification ---------------------------------------------------------------------------


def _file_of(store: LocalStorage, step: int, name: str) -> Path:
    manifest = json.loads(store.get_bytes(f"job/{checkpoint_id_for(step)}/{MANIFEST_NAME}"))
    return store.root / "job" / checkpoint_id_for(step) / manifest["files"][name]["file"]


def test_corrupt_newest_is_skipped_with_warning(store: LocalStorage, caplog) -> None:
    manager = CheckpointManager(store, "job")
    save_steps(manager, [1, 2, 3])
    path = _file_of(store, 3, "model")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit-pattern, same size
    path.write_bytes(bytes(data))

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        loaded = manager.latest()
    assert loaded is not None and loaded.step == 2
    assert "step-000000003 is unusable" in caplog.text and "sha256" in caplog.text
    with pytest.raises(CheckpointCorruptError, match="sha256"):
        manager.load("step-000000003")


def test_truncated_missing_and_garbled_manifest_are_skipped(store: LocalStorage, caplog) -> None:
    manager = CheckpointManager(store, "job", keep_last=5)
    save_steps(manager, [1, 2, 3, 4])
    truncated = _file_of(store, 4, "model")
    truncated.write_bytes(truncated.read_bytes()[:100])
    _file_of(store, 3, "sampler").unlink()
    (store.root / "job" / checkpoint_id_for(2) / MANIFEST_NAME).write_text("{not json")

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        loaded = manager.latest()
    assert loaded is not None and loaded.step == 1
    assert "has 100 bytes" in caplog.text
    assert "is missing" in caplog.text
    assert "malformed" in caplog.text


def test_latest_is_none_without_usable_checkpoints(store: LocalStorage) -> None:
    manager = CheckpointManager(store, "job")
    assert manager.latest() is None
    assert manager.list() == []
    save_steps(manager, [5])
    _file_of(store, 5, "model").write_bytes(b"")
    assert manager.latest() is None


# -- pruning and re-saves -------------------------------------------------------------------


def test_keep_last_prunes_oldest(store: LocalStorage) -> None:
    manager = CheckpointManager(store, "job", keep_last=2)
    other = CheckpointManager(store, "other-job", keep_last=2)
    save_steps(other, [1])
    save_steps(manager, [1, 2, 3, 4, 5])
    assert [info.checkpoint_id for info in manager.list()] == ["step-000000004", "step-000000005"]
    folders = {key.split("/")[1] for key in store.list("job/")}
    assert folders == {"step-000000004", "step-000000005"}
    assert [info.step for info in other.list()] == [1]  # other jobs untouched
    assert all(info.size_bytes > 0 for info in manager.list())


def test_resave_same_step_replaces_files(store: LocalStorage) -> None:
    manager = CheckpointManager(store, "job")
    manager.save({"sampler": {"position": 1}}, 9, {})
    manager.save({"sampler": {"position": 2}}, 9, {})
    assert manager.latest().state["sampler"] == {"position": 2}
    assert len(store.list("job/step-000000009/")) == 2  # new data file + manifest only


def test_steps_sort_numerically_beyond_nine_digits(store: LocalStorage) -> None:
    manager = CheckpointManager(store, "job", keep_last=2)
    manager.save({"s": {"p": 1}}, 8, {})
    manager.save({"s": {"p": 2}}, 999_999_999, {})
    manager.save({"s": {"p": 3}}, 1_000_000_000, {})
    assert [i.step for i in manager.list()] == [999_999_999, 1_000_000_000]
    assert manager.latest().state["s"] == {"p": 3}


def test_saving_behind_newer_checkpoints_keeps_it_and_warns(store: LocalStorage, caplog) -> None:
    manager = CheckpointManager(store, "job", keep_last=2)
    save_steps(manager, [100, 200])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        manager.save({"s": {"p": 1}}, 150, {})
    assert "holds newer checkpoints ['step-000000200']" in caplog.text
    assert [i.step for i in manager.list()] == [150, 200]  # just saved: never pruned at once
    manager.save({"s": {"p": 2}}, 151, {})
    assert [i.step for i in manager.list()] == [151, 200]


# -- model identity -------------------------------------------------------------------------


def test_model_mismatch_is_refused_and_nothing_overwritten(store: LocalStorage) -> None:
    small, wide = TinyNet(width=16), TinyNet(width=32)
    assert model_fingerprint(small) != model_fingerprint(wide)
    assert model_fingerprint(small) == model_fingerprint(TinyNet(width=16))
    manager = CheckpointManager(store, "job")
    save_steps(manager, [1], model=small)
    before = {key: store.get_bytes(key) for key in store.list("")}

    expecting_wide = CheckpointManager(store, "job", expected_model=model_fingerprint(wide))
    with pytest.raises(ModelMismatchError, match="expected"):
        expecting_wide.latest()
    with pytest.raises(ModelMismatchError):
        manager.load("step-000000001", expected_model=model_fingerprint(wide))
    with pytest.raises(ModelMismatchError, match="nothing written"):
        save_steps(manager, [2], model=wide)
    with pytest.raises(ModelMismatchError, match="nothing written"):
        expecting_wide.save({"model": small.state_dict()}, 3, meta_for(small))
    assert {key: store.get_bytes(key) for key in store.list("")} == before
    assert manager.latest(expected_model=model_fingerprint(small)).step == 1


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "step", "meta", "match"),
    [
        ({"model": {}}, -1, {}, "step"),
        ({"model": {}}, True, {}, "step"),
        ({}, 1, {}, "non-empty"),
        ({"../model": {}}, 1, {}, "state key"),
        ({"model": {}}, 1, {"when": object()}, "JSON"),
    ],
)
def test_bad_save_input_writes_nothing(store: LocalStorage, state, step, meta, match) -> None:
    manager = CheckpointManager(store, "job")
    with pytest.raises((ValueError, TypeError), match=match):
        manager.save(state, step, meta)
    assert store.list("") == []


def test_bad_manager_arguments(store: LocalStorage) -> None:
    with pytest.raises(ValueError, match="job_id"):
        CheckpointManager(store, "a/b")
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointManager(store, "job", keep_last=0)
    with pytest.raises(ValueError, match="checkpoint id"):
        CheckpointManager(store, "job").load("latest")


# -- S3 and the benchmark -------------------------------------------------------------------


def test_s3_round_trip_multipart(s3_bucket: S3Storage) -> None:
    manager = CheckpointManager(s3_bucket, "s3-job", keep_last=1)
    big = torch.randn(6 * (1 << 20) // 4)  # 6 MiB: above the 5 MiB multipart threshold
    manager.save({"model": {"w": big}, "sampler": {"position": 1}}, 1, {"model_name": "big"})
    manager.save({"model": {"w": big * 2}, "sampler": {"position": 2}}, 2, {"model_name": "big"})
    loaded = CheckpointManager(s3_bucket, "s3-job").latest()
    assert loaded is not None and loaded.step == 2
    assert torch.equal(loaded.state["model"]["w"], big * 2)
    assert [info.step for info in manager.list()] == [2]
    assert all(key.startswith("s3-job/step-000000002/") for key in s3_bucket.list(""))


def test_benchmark_reports_and_cleans_up(tmp_path: Path) -> None:
    result = measure_checkpoint_throughput(tmp_path / "bench", size_mb=3, repeats=1)
    assert result["resume_exact"] is True
    assert result["size_mb"] == pytest.approx(3, rel=0.01)
    assert result["bytes_written"] >= 3 << 20
    for key in ("raw_write_mb_s", "save_mb_s", "ratio", "resume_s"):
        assert result[key] > 0
    assert result["ratio"] == pytest.approx(result["raw_write_s"] / result["save_s"])
    assert list((tmp_path / "bench").iterdir()) == []


# -- fencing ----------------------------------------------------------------------------
def test_a_stale_attempts_checkpoint_write_is_refused(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path)
    old = CheckpointManager(store, "job", fencing_token=5)
    new = CheckpointManager(store, "job", fencing_token=7)
    old.save({"w": torch.ones(2)}, 10)
    new.save({"w": torch.zeros(2)}, 4)  # attempt 2 resumed from an older checkpoint
    with pytest.raises(StaleTokenError, match=r"fencing token 5: step-000000004 .* token 7"):
        old.save({"w": torch.ones(2)}, 20)
    assert [c.checkpoint_id for c in new.list()] == ["step-000000004", "step-000000010"]
    assert new.newest_token() == (7, "step-000000004")
    # The newer writer goes on; a writer without a token (no lease) is not fenced.
    new.save({"w": torch.zeros(2)}, 6)
    CheckpointManager(store, "job").save({"w": torch.zeros(2)}, 8)
    manifest = json.loads((tmp_path / "job" / "step-000000006" / "manifest.json").read_text())
    assert manifest["fencing_token"] == 7
    with pytest.raises(ValueError, match="fencing_token must be an integer"):
        CheckpointManager(store, "job", fencing_token="7")  # type: ignore[arg-type]
