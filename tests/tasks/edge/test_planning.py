"""A redeploy reuses the profile of the version it replaces only when that profile stands
for the very same export, measured the same way."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from types import SimpleNamespace

from gpuflow.tasks.edge.export import ExportedModel
from gpuflow.tasks.edge.planning import stored_profile


def _previous(root: Path, exported, profile) -> SimpleNamespace:
    """A previous version's record as the flow leaves it: model/ with export and profile."""
    model_dir = root / "model"
    shutil.copytree(exported.onnx_path.parent, model_dir)
    profile.save(model_dir / "profile.json")
    return SimpleNamespace(root=root)


def test_the_same_export_measured_the_same_way_reuses_the_profile(
    exported_digits, digits_profile, tmp_path: Path
) -> None:
    previous = _previous(tmp_path / "v1", exported_digits, digits_profile)
    assert ExportedModel.load(previous.root / "model").model_name == exported_digits.model_name
    threads = digits_profile.intra_op_threads
    reused = stored_profile(previous, exported_digits, threads)
    assert reused is not None and reused.node_ms == digits_profile.node_ms
    assert stored_profile(None, exported_digits, threads) is None
    assert stored_profile(previous, exported_digits, threads + 1) is None  # other threads


def test_another_export_or_a_missing_profile_measures_again(
    exported_digits, digits_profile, tmp_path: Path
) -> None:
    previous = _previous(tmp_path / "v1", exported_digits, digits_profile)
    threads = digits_profile.intra_op_threads
    changed_onnx = tmp_path / "changed.onnx"
    changed_onnx.write_bytes(exported_digits.onnx_path.read_bytes() + b"\0")
    changed = dataclasses.replace(exported_digits, onnx_path=changed_onnx)
    assert stored_profile(previous, changed, threads) is None  # not the same bytes
    assert stored_profile(previous, exported_digits, threads) is not None
    (previous.root / "model" / "profile.json").unlink()
    assert stored_profile(previous, exported_digits, threads) is None
