"""Single-tensor cut points of an ONNX graph, found by graph analysis (not by names).

A tensor ``t`` is a cut point when the graph splits into a prefix and a suffix that talk
through ``t`` alone: take the prefix to be the producer of ``t`` with all its ancestors
(the smallest prefix that can compute ``t``), then the *live set* at the boundary, the
non-constant tensors made in the prefix (graph inputs included) that the suffix or the
graph's outputs still need, must be exactly ``{t}``. Tensors that depend only on
initializers and Constant nodes do not count as live: whichever shard needs them recomputes
them from its own copy of the weights. Inside a residual block the skip path keeps a second
tensor live, so a ResNet's cuts fall only between blocks.

The cut points of a graph are nested (each one's prefix contains the previous one's), so
they cut the graph into a chain of *segments*: the nodes between two consecutive cuts. A
partition into k shards picks k-1 of the cuts.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

import onnx
from gpuflow.tasks.edge.manifest import KSERVE_TO_NUMPY, TensorSpec, kserve_dtype
from onnx import numpy_helper


class CutError(ValueError):
    """The graph cannot be cut as asked (for example: it has no single-tensor cut)."""


@dataclass(frozen=True)
class CutPoint:
    """A cut tensor, the number of nodes before it, and its size per batch item."""

    tensor: str
    prefix_nodes: int
    spec: TensorSpec
    bytes_per_item: int


@dataclass
class GraphCuts:
    """A graph's nodes in topological order, its cut points and the segments they make.

    ``segments[i]`` is the list of node indices (into ``order``) between cut ``i-1`` and cut
    ``i``; there are ``len(cuts) + 1`` segments. Segment boundaries carry ``boundary[i]``
    (the graph input before segment 0, the graph output after the last).
    """

    order: list[onnx.NodeProto]
    node_names: list[str]
    cuts: list[CutPoint]
    segments: list[list[int]]
    input_spec: TensorSpec
    output_spec: TensorSpec
    weight_bytes: list[int] = field(default_factory=list)  # per segment
    # Per segment, per batch item: the largest working set of one operator (its dynamic
    # inputs and outputs together), the segment's activation peak as onnxruntime runs it.
    activation_bytes: list[int] = field(default_factory=list)

    @property
    def boundaries(self) -> list[TensorSpec]:
        """Tensor specs at the m+1 boundaries of m segments: input, cuts..., output."""
        return [self.input_spec, *(c.spec for c in self.cuts), self.output_spec]


def _elem_dtype(elem_type: int) -> str:
    return kserve_dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def _value_spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        raise CutError(f"tensor {value.name!r} has no shape in value_info; run shape inference")
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim]
    return TensorSpec(value.name, tuple(dims), _elem_dtype(tensor_type.elem_type))


def bytes_per_item(spec: TensorSpec) -> int:
    """Bytes of one batch item (dimension 0 is the batch; other -1 dims count as 1)."""
    count = 1
    for dim in spec.shape[1:]:
        count *= max(dim, 1)
    return count * KSERVE_TO_NUMPY[spec.dtype].itemsize


def topological_order(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Kahn's algorithm, ties broken by the file's node order (so it is deterministic)."""
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for out in node.output:
            if out:
                producer[out] = i
    consumers: dict[int, list[int]] = defaultdict(list)
    indegree = [0] * len(graph.node)
    for i, node in enumerate(graph.node):
        deps = {producer[name] for name in node.input if name in producer}
        indegree[i] = len(deps)
        for dep in deps:
            consumers[dep].append(i)
    ready = deque(i for i, d in enumerate(indegree) if d == 0)
    order: list[int] = []
    while ready:
        i = ready.popleft()
        order.append(i)
        for j in sorted(consumers[i]):
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    if len(order) != len(graph.node):
        raise CutError("the graph has a cycle; not a valid ONNX model")
    return [graph.node[i] for i in order]


def find_cuts(model: onnx.ModelProto) -> GraphCuts:
    """The single-tensor cut points of a one-input, one-output ONNX model (shapes inferred)."""
    graph = model.graph
    initializers = {init.name for init in graph.initializer}
    real_inputs = [v for v in graph.input if v.name not in initializers]
    if len(real_inputs) != 1 or len(graph.output) != 1:
        raise CutError(
            f"slicing needs one graph input and one output, got inputs "
            f"{[v.name for v in real_inputs]} and outputs {[v.name for v in graph.output]}"
        )
    if any(n.op_type in ("If", "Loop", "Scan") for n in graph.node):
        raise CutError("graphs with control flow (If/Loop/Scan) are not sliced")
    order = topological_order(graph)
    n = len(order)
    graph_input = real_inputs[0].name
    graph_output = graph.output[0].name

    producer: dict[str, int] = {}
    for i, node in enumerate(order):
        for out in node.output:
            if out:
                producer[out] = i
    node_inputs = [[name for name in node.input if name] for node in order]

    # Tensors that depend on the graph input; everything else is a constant of the weights.
    dynamic: set[str] = {graph_input}
    for i, node in enumerate(order):
        if any(name in dynamic for name in node_inputs[i]):
            dynamic.update(out for out in node.output if out)

    # Ancestor sets as bitsets over topological positions (ints make union cheap).
    ancestors = [0] * n
    for i in range(n):
        mask = 1 << i
        for name in node_inputs[i]:
            p = producer.get(name)
            if p is not None:
                mask |= ancestors[p]
        ancestors[i] = mask

    # Who reads each dynamic tensor (the graph output counts as a reader beyond every node).
    readers: dict[str, list[int]] = defaultdict(list)
    for i in range(n):
        for name in set(node_inputs[i]):
            if name in dynamic:
                readers[name].append(i)
    readers[graph_output].append(n)

    value_infos = {v.name: v for v in (*graph.value_info, *graph.input, *graph.output)}
    if any(name not in value_infos for name in dynamic):
        value_infos.update(_inferred_value_infos(model, order))
    cuts: list[CutPoint] = []
    for pos, node in enumerate(order):
        outs = [o for o in node.output if o in dynamic]
        if len(outs) != 1 or outs[0] == graph_output:
            continue
        tensor = outs[0]
        prefix = ancestors[pos]
        if not readers[tensor] or not any(not (prefix >> r) & 1 for r in readers[tensor]):
            continue
        if _is_single_cut(prefix, tensor, graph_input, producer, readers, dynamic):
            if tensor not in value_infos:
                raise CutError(f"cut tensor {tensor!r} has no value_info; run shape inference")
            spec = _value_spec(value_infos[tensor])
            cuts.append(CutPoint(tensor, prefix.bit_count(), spec, bytes_per_item(spec)))
    cuts.sort(key=lambda c: c.prefix_nodes)

    # Segments: the nodes each cut's prefix adds to the previous one's.
    segments: list[list[int]] = []
    previous = 0
    for cut in cuts:
        prefix = ancestors[producer[cut.tensor]]
        segments.append([i for i in range(n) if (prefix >> i) & 1 and not (previous >> i) & 1])
        previous = prefix
    segments.append([i for i in range(n) if not (previous >> i) & 1])

    weights = {init.name: numpy_helper.to_array(init).nbytes for init in graph.initializer}
    weight_bytes = []
    for seg in segments:
        used = {name for i in seg for name in node_inputs[i] if name in weights}
        weight_bytes.append(sum(weights[name] for name in used))

    def item_bytes(name: str) -> int:
        value = value_infos.get(name)
        if value is None or not value.type.tensor_type.HasField("shape"):
            return 0  # unknown shape: counted as nothing rather than guessed
        return bytes_per_item(_value_spec(value))

    activation_bytes = [
        max(
            (
                sum(item_bytes(t) for t in {*node_inputs[i], *order[i].output} if t in dynamic)
                for i in seg
            ),
            default=0,
        )
        for seg in segments
    ]

    return GraphCuts(
        order=order,
        node_names=[node.name or f"node_{i}" for i, node in enumerate(order)],
        cuts=cuts,
        segments=segments,
        input_spec=_value_spec(real_inputs[0]),
        output_spec=_value_spec(graph.output[0]),
        weight_bytes=weight_bytes,
        activation_bytes=activation_bytes,
    )


def _inferred_value_infos(
    model: onnx.ModelProto, order: list[onnx.NodeProto]
) -> dict[str, onnx.ValueInfoProto]:
    """Shape inference over a topologically sorted copy (it needs producers before readers)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.graph.node[:]
    copy.graph.node.extend(order)
    inferred = onnx.shape_inference.infer_shapes(copy).graph
    return {v.name: v for v in inferred.value_info}


def _is_single_cut(
    prefix: int,
    tensor: str,
    graph_input: str,
    producer: dict[str, int],
    readers: dict[str, list[int]],
    dynamic: set[str],
) -> bool:
    """True when ``tensor`` is the only dynamic tensor crossing from ``prefix`` to the rest."""
    for name in dynamic:
        if name == tensor:
            continue
        p = producer.get(name)
        made_in_prefix = name == graph_input or (p is not None and (prefix >> p) & 1)
        if made_in_prefix and any(not (prefix >> r) & 1 for r in readers.get(name, ())):
            return False
    return True


def live_tensor_counts(model: onnx.ModelProto) -> list[int]:
    """Number of live dynamic tensors after each node of the topological order (diagnostics)."""
    graph = model.graph
    order = topological_order(graph)
    initializers = {init.name for init in graph.initializer}
    graph_input = next(v.name for v in graph.input if v.name not in initializers)
    dynamic = {graph_input}
    last_use: dict[str, int] = {}
    for i, node in enumerate(order):
        if any(name in dynamic for name in node.input):
            dynamic.update(o for o in node.output if o)
        for name in node.input:
            last_use[name] = i
    for out in graph.output:
        last_use[out.name] = len(order)
    born = {graph_input: -1}
    for i, node in enumerate(order):
        for o in node.output:
            born.setdefault(o, i)
    counts = []
    for i in range(len(order)):
        counts.append(sum(1 for t in dynamic if born.get(t, len(order)) <= i < last_use.get(t, -1)))
    return counts
