"""Tiny ONNX models cut into shards, packaged with real manifests, and OIP servers on loopback.

The models are built with onnx.helper (no export step, so the fixtures take milliseconds)
and cut with onnx.utils.extract_model, the same call the packaging step uses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx.utils
import onnxruntime as ort
import pytest
from gpuflow.tasks.edge.manifest import (
    ShardManifest,
    TensorSpec,
    file_sha256,
    kserve_dtype,
    save_manifest,
)
from gpuflow.tasks.edge.serving.server import ShardServer, start_shard_server
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# A boundary tensor of 1.6 M float32 = 6.4 MB, over gRPC's 4 MiB default message limit.
BIG_ELEMENTS = 1_600_000


def _model(nodes, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8  # what every onnxruntime >= 1.14 reads
    onnx.checker.check_model(model)
    return model


def mlp_model() -> onnx.ModelProto:
    """x[N,4] -> h1[N,8] -> h2[N,6] -> (y[N,3], probs[N,3]); single-tensor cuts at h1, h2."""
    rng = np.random.default_rng(0)

    def init(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["h1"]),
        helper.make_node("MatMul", ["h1", "w2"], ["m2"]),
        helper.make_node("Add", ["m2", "b2"], ["a2"]),
        helper.make_node("Relu", ["a2"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w3"], ["m3"]),
        helper.make_node("Add", ["m3", "b3"], ["y"]),
        helper.make_node("Softmax", ["y"], ["probs"], axis=-1),
    ]
    inits = [
        init("w1", 4, 8),
        init("b1", 8),
        init("w2", 8, 6),
        init("b2", 6),
        init("w3", 6, 3),
        init("b3", 3),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    probs = helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 3])
    return _model(nodes, [x], [y, probs], inits)


def big_model() -> onnx.ModelProto:
    """a[1,BIG] -> h = 2a (6.4 MB) -> s = sum(h) [1,1]; the single cut is at h."""
    nodes = [
        helper.make_node("Mul", ["a", "two"], ["h"]),
        helper.make_node("ReduceSum", ["h", "axes"], ["s"], keepdims=1),
    ]
    inits = [
        numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axes"),
    ]
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, BIG_ELEMENTS])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 1])
    return _model(nodes, [a], [s], inits)


def _specs(values) -> list[TensorSpec]:
    specs = []
    for v in values:
        t = v.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
        dtype = kserve_dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
        specs.append(TensorSpec(v.name, shape, dtype))
    return specs


def package_shard(
    onnx_path: Path,
    shard_dir: Path,
    model_name: str,
    index: int,
    num_shards: int,
    **manifest_fields: object,
) -> Path:
    """Move an extracted ONNX file into a shard folder and write its manifest."""
    shard_dir.mkdir(parents=True, exist_ok=True)
    target = shard_dir / "model.onnx"
    onnx_path.replace(target)
    model = onnx.load(target)
    manifest = ShardManifest(
        model_name=model_name,
        shard_index=index,
        num_shards=num_shards,
        onnx_file=target.name,
        sha256=file_sha256(target),
        inputs=_specs(model.graph.input),
        outputs=_specs(model.graph.output),
        opset=OPSET,
        **manifest_fields,  # type: ignore[arg-type]
    )
    save_manifest(manifest, shard_dir)
    return shard_dir


@dataclass(frozen=True)
class ShardSet:
    """A model, cut into shards with manifests, plus the unsplit model as one shard."""

    full_onnx: Path
    full_dir: Path  # the whole model packaged as a 1-shard "chain"
    shard_dirs: list[Path]
    model_names: list[str]

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        session = ort.InferenceSession(str(self.full_onnx), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, inputs), strict=True))


def cut_into_shards(model: onnx.ModelProto, root: Path, name: str, cuts: list[str]) -> ShardSet:
    root.mkdir(parents=True, exist_ok=True)
    full = root / f"{name}.onnx"
    onnx.save(model, full)
    inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output]
    bounds = [inputs, *([c] for c in cuts), outputs]
    dirs, names = [], []
    for index in range(len(bounds) - 1):
        part = root / f"{name}-part{index}.onnx"
        onnx.utils.extract_model(str(full), str(part), bounds[index], bounds[index + 1])
        shard_name = f"{name}-shard{index}"
        dirs.append(package_shard(part, root / shard_name, shard_name, index, len(bounds) - 1))
        names.append(shard_name)
    whole = root / f"{name}-whole.onnx"
    onnx.save(model, whole)
    full_dir = package_shard(whole, root / f"{name}-whole", f"{name}-whole", 0, 1)
    return ShardSet(full, full_dir, dirs, names)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> ShardSet:
    return cut_into_shards(mlp_model(), tmp_path_factory.mktemp("mlp"), "mlp", ["h1", "h2"])


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> ShardSet:
    return cut_into_shards(big_model(), tmp_path_factory.mktemp("big"), "big", ["h"])


@pytest.fixture(scope="module")
def start_server() -> Iterator[Callable[..., ShardServer]]:
    """start_shard_server on a free loopback port; every server started is stopped after."""
    started: list[ShardServer] = []

    def start(shard_dir: Path, port: int = 0, **kwargs: object) -> ShardServer:
        server = start_shard_server(shard_dir, "127.0.0.1", port, **kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in reversed(started):
            server.stop(grace_s=0.5)


@pytest.fixture(scope="module")
def mlp_servers(mlp: ShardSet, start_server: Callable[..., ShardServer]) -> list[ShardServer]:
    """The MLP's three shards served in driver mode (no forwarding)."""
    return [start_server(d) for d in mlp.shard_dirs]


@pytest.fixture(scope="module")
def mlp_whole(mlp: ShardSet, start_server: Callable[..., ShardServer]) -> ShardServer:
    return start_server(mlp.full_dir)


@pytest.fixture(scope="module")
def mlp_forwarding(mlp: ShardSet, start_server: Callable[..., ShardServer]) -> list[ShardServer]:
    """The MLP's shards as a forwarding chain, started last to first."""
    servers: list[ShardServer] = []
    next_address, next_model = "", None
    for shard_dir, name in reversed(list(zip(mlp.shard_dirs, mlp.model_names, strict=True))):
        servers.insert(
            0, start_server(shard_dir, forward_to=next_address, forward_model=next_model)
        )
        next_address, next_model = servers[0].address, name
    return servers
