"""Per-node cost of an ONNX graph, measured with onnxruntime's own profiler.

Graph optimisation is switched off so that the profiled kernels are the graph's own nodes
under their own names (with fusion on, a Conv+Relu would be reported as one fused node that
no cut can see). The profiler writes a Chrome-trace JSON; every "Node" event is one kernel
run (``<node name>_kernel_time``, ``dur`` in microseconds) and every "model_run" Session
event one whole run, so the node events of the warm-up runs are dropped by time window and
each node's cost is the median over the measured runs.

Profile on the kind of machine a shard will run on, with the threads it will have there
(``intra_op_threads``; 1 emulates a one-core edge box).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

_KERNEL_SUFFIX = "_kernel_time"


@dataclass(frozen=True)
class NodeProfile:
    """Median cost per graph node in milliseconds, and of the whole run."""

    node_ms: dict[str, float]
    run_ms: float  # median model_run duration (includes the executor's own overhead)
    runs: int
    warmup: int
    intra_op_threads: int
    batch: int

    @property
    def total_node_ms(self) -> float:
        return sum(self.node_ms.values())

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> NodeProfile:
        return cls(**data)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> NodeProfile:
        return cls.from_dict(json.loads(Path(path).read_text()))


def session_options(intra_op_threads: int = 1, *, optimize: bool = False) -> ort.SessionOptions:
    """SessionOptions with a fixed thread count; graph optimisation off unless asked for."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


def profile_nodes(
    onnx_path: str | Path,
    inputs: dict[str, np.ndarray],
    *,
    runs: int = 10,
    warmup: int = 3,
    intra_op_threads: int = 1,
) -> NodeProfile:
    """Run the model ``warmup + runs`` times under the profiler; median per-node cost in ms."""
    if runs < 1 or warmup < 0:
        raise ValueError(f"runs must be >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    if intra_op_threads < 0:
        raise ValueError(f"intra_op_threads must be >= 0, got {intra_op_threads}")
    with tempfile.TemporaryDirectory(prefix="gpuflow-ort-profile-") as tmp:
        options = session_options(intra_op_threads)
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "profile")
        session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        for _ in range(warmup + runs):
            session.run(None, inputs)
        events = json.loads(Path(session.end_profiling()).read_text())
    return _summarise(events, runs, warmup, intra_op_threads, _batch_of(inputs))


def _batch_of(inputs: dict[str, np.ndarray]) -> int:
    first = next(iter(inputs.values()))
    return int(first.shape[0]) if first.ndim else 1


def _summarise(
    events: list[dict], runs: int, warmup: int, intra_op_threads: int, batch: int
) -> NodeProfile:
    model_runs = sorted(
        (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
        key=lambda e: e["ts"],
    )
    if len(model_runs) != warmup + runs:
        raise RuntimeError(f"profiler recorded {len(model_runs)} runs, expected {warmup + runs}")
    measured = model_runs[warmup:]
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in measured]
    per_run: list[dict[str, float]] = [{} for _ in measured]
    for event in events:
        if event.get("cat") != "Node" or not event.get("name", "").endswith(_KERNEL_SUFFIX):
            continue
        node = event["name"][: -len(_KERNEL_SUFFIX)]
        ts = event["ts"]
        for i, (start, end) in enumerate(windows):
            if start <= ts <= end:
                per_run[i][node] = per_run[i].get(node, 0.0) + event["dur"] / 1000.0
                break
    names = sorted(set().union(*per_run))
    node_ms = {name: statistics.median(run.get(name, 0.0) for run in per_run) for name in names}
    run_ms = statistics.median(e["dur"] / 1000.0 for e in measured)
    return NodeProfile(node_ms, run_ms, runs, warmup, intra_op_threads, batch)


def segment_costs_ms(
    profile: NodeProfile, node_names: list[str], segments: list[list[int]]
) -> list[float]:
    """Sum the profiled node costs of each segment (nodes the profiler never saw cost 0)."""
    return [sum(profile.node_ms.get(node_names[i], 0.0) for i in seg) for seg in segments]


# --- Prefect task ---------------------------------------------------------------------------
from prefect import task  # noqa: E402
from prefect.cache_policies import NONE  # noqa: E402

profile_task = task(profile_nodes, name="edge-profile", cache_policy=NONE)
