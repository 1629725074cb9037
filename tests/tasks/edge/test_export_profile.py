"""Export (dynamo, opset recorded, shapes inferred) and per-node profiling."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from gpuflow.tasks.edge.cuts import find_cuts
from gpuflow.tasks.edge.export import EXPORT_INFO_FILE, export_model, torch_reference
from gpuflow.tasks.edge.profile import _summarise, profile_nodes, segment_costs_ms


def test_resnet_export_matches_torch(exported_digits) -> None:
    assert exported_digits.opset == 18
    info = json.loads((exported_digits.onnx_path.parent / EXPORT_INFO_FILE).read_text())
    assert info["opset"] == 18 and info["family"] == "resnet"
    model = onnx.load(str(exported_digits.onnx_path))
    batch_dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch_dim.dim_param  # the batch is dynamic: one shard serves any batch size
    session = ort.InferenceSession(
        str(exported_digits.onnx_path), providers=["CPUExecutionProvider"]
    )
    x = exported_digits.sample_inputs(batch=3)
    got = session.run(None, x)[0]
    want = torch_reference("resnet18-digits", x["input"])
    assert got.shape == (3, 10)
    assert np.max(np.abs(got - want)) <= 1e-4


def test_llama_decoder_exports_with_cuts_between_blocks(tmp_path) -> None:
    exported = export_model("llama-tiny", tmp_path, overrides={"n_layers": 2})
    assert exported.input_dtype == "int64" and exported.opset == 18
    x = exported.sample_inputs(batch=2)
    session = ort.InferenceSession(str(exported.onnx_path), providers=["CPUExecutionProvider"])
    got = session.run(None, x)[0]
    want = torch_reference("llama-tiny", x["input"], overrides={"n_layers": 2})
    assert np.max(np.abs(got - want)) <= 1e-4
    cuts = find_cuts(onnx.load(str(exported.onnx_path)))
    producer = {o: n for n in cuts.order for o in n.output}
    # Each decoder block ends in a residual Add that is a single-tensor cut (2 per block:
    # after attention and after the feed-forward), so there is a cut between the blocks.
    residual = [c for c in cuts.cuts if producer[c.tensor].op_type == "Add"]
    assert len(residual) >= 2 * 2
    assert all(c.spec.shape == (-1, 32, 64) for c in residual)


def test_profile_covers_every_node(exported_digits, digits_profile) -> None:
    model = onnx.load(str(exported_digits.onnx_path))
    names = {n.name for n in model.graph.node}
    assert set(digits_profile.node_ms) == names
    assert all(v >= 0 for v in digits_profile.node_ms.values())
    assert digits_profile.runs == 5 and digits_profile.warmup == 2
    # The kernels account for most of a run (the rest is the executor's bookkeeping).
    assert 0 < digits_profile.total_node_ms <= digits_profile.run_ms * 1.5
    cuts = find_cuts(model)
    costs = segment_costs_ms(digits_profile, cuts.node_names, cuts.segments)
    assert sum(costs) == pytest.approx(digits_profile.total_node_ms)


def test_warmup_runs_are_excluded_and_median_taken() -> None:
    def run(ts: int, node_us: int) -> list[dict]:
        return [
            {"cat": "Session", "name": "model_run", "ts": ts, "dur": 100},
            {"cat": "Node", "name": "conv_kernel_time", "ts": ts + 1, "dur": node_us},
            {"cat": "Node", "name": "conv_fence_before", "ts": ts + 1, "dur": 99},
        ]

    events = run(0, 90_000) + run(1000, 2000) + run(2000, 3000) + run(3000, 10_000)
    profile = _summarise(events, runs=3, warmup=1, intra_op_threads=1, batch=1)
    assert profile.node_ms == {"conv": 3.0}  # median of 2, 3, 10 ms; the 90-ms warm-up gone


def test_profile_rejects_bad_counts(exported_digits) -> None:
    with pytest.raises(ValueError, match="runs must be >= 1"):
        profile_nodes(exported_digits.onnx_path, exported_digits.sample_inputs(), runs=0)


def test_cached_export_reuses_an_earlier_export(tmp_path, exported_digits, monkeypatch) -> None:
    import shutil

    from gpuflow.tasks.edge import export as export_mod
    from gpuflow.tasks.edge.export import ExportedModel, cached_export

    calls = []

    def fake_export(model_name, out_dir, **kwargs):  # stands in for the slow exporter
        calls.append(model_name)
        Path(out_dir).mkdir(parents=True)
        shutil.copy(exported_digits.onnx_path, Path(out_dir) / f"{model_name}.onnx")
        shutil.copy(exported_digits.onnx_path.parent / EXPORT_INFO_FILE, out_dir)
        return exported_digits

    monkeypatch.setattr(export_mod, "export_model", fake_export)
    first = cached_export("resnet18-digits", tmp_path / "a")
    second = cached_export("resnet18-digits", tmp_path / "b")
    assert calls == ["resnet18-digits"]  # the second deploy did not export again
    assert second.onnx_path == tmp_path / "b" / "resnet18-digits.onnx"
    assert second.onnx_path.read_bytes() == first.onnx_path.read_bytes()
    assert ExportedModel.load(tmp_path / "b") == second
    cached_export("resnet18-digits", tmp_path / "c", seed=1)
    assert calls == ["resnet18-digits"] * 2  # another seed is another model
