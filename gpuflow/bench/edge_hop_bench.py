"""The cost of one hop of a served chain: `gpuflow bench edge`'s first part.

A chain of k shard servers (separate processes, forwarding, as deployed) passes one FP32
activation of 1.6 MB (ResNet-50's stage-2 boundary, [1, 512, 28, 28]) from shard to shard;
each shard multiplies it by one (the last also sums it), so the compute is small and
measured by the shards themselves (``nv_inference_compute_infer_duration_us`` on their
/metrics). A request makes k hops carrying the tensor (client -> shard 0 -> ... -> shard
k-1), and the per-hop overhead is

    (chain latency - sum of the shards' compute) / k

Every hop, the client's included, sends its request on an open ModelStreamInfer stream
(serving/stream.py: no call set-up per request). Two transports, each in a chain of its
own, both started before any is measured: ``raw``
(the tensor in the gRPC message, as across hosts) and ``shm`` (Triton's system
shared-memory extension: the message carries only a reference; serving/shm.py). Shard i is
pinned to core i mod cores. Each round sends a block of requests to one chain, then a block
to the other (the order alternating between rounds): requests are never interleaved
one by one, since then one chain's shard would still be busy on a core while the other's
is timed. While one chain is timed the other chain's shard servers are stopped (SIGSTOP,
then SIGCONT): idle, they still wake for gRPC's and the HTTP server's timers; at 4 shards
on 2 cores a hop measured 1.33 ms with them running and 1.07 / 1.23 ms with them stopped
(three runs in a row). The machine is then as idle as a served chain would find it. A
third block per round times an empty call (``ServerLive`` on the shm chain's
head): the floor a Python gRPC round trip sets, against which a hop can be judged. The
figure is the mean over rounds with a 95 % t interval; the machine's 1-minute load
average is reported before and after (the figure is only meaningful on an idle machine).

Where a hop's time goes, from the shards' phase counters (serving/metrics.py), per hop:
``in_servers`` is what the servers' handlers spent outside the model and the next hop
(decoding the inputs, encoding the outputs, the stream's and handler's framing) and
``between`` the rest: the caller's hand-over (its encoding: the slot write for shm), the
wire and the wake-ups of the processes. A machine whose hop exceeds another's says by
these two which side it loses on.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpuflow.bench.figures import ci95
from gpuflow.bench.host_load import CpuTimes, load_report

Report = Callable[[str], None]
SHAPE = (1, 512, 28, 28)  # 1,605,632 bytes in FP32
TRANSPORTS = {"raw": "off", "shm": "auto"}  # shm: shared memory where it is local


def _shard_models(k: int, root: Path) -> list[Path]:
    """k shard folders: t_i -> Mul(1) -> t_{i+1}; the last also sums to [1, 1]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from gpuflow.tasks.edge.manifest import ShardManifest, TensorSpec, file_sha256, save_manifest

    dirs = []
    for i in range(k):
        last = i == k - 1
        nodes = [helper.make_node("Mul", [f"t{i}", "one"], ["y" if not last else "m"])]
        inits = [numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one")]
        out_name, out_shape = f"t{i + 1}", list(SHAPE)
        if last:
            nodes.append(helper.make_node("ReduceSum", ["m", "axes"], ["sum"], keepdims=0))
            inits.append(numpy_helper.from_array(np.array([1, 2, 3], dtype=np.int64), "axes"))
            out_name, out_shape = "sum", [SHAPE[0]]
        else:
            nodes[0].output[0] = out_name
        graph = helper.make_graph(
            nodes,
            f"hop{i}",
            [helper.make_tensor_value_info(f"t{i}", TensorProto.FLOAT, list(SHAPE))],
            [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, out_shape)],
            inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        shard_dir = root / f"hop-shard{i}"
        shard_dir.mkdir(parents=True)
        onnx.save(model, shard_dir / "model.onnx")
        save_manifest(
            ShardManifest(
                model_name=f"hop-shard{i}",
                shard_index=i,
                num_shards=k,
                onnx_file="model.onnx",
                sha256=file_sha256(shard_dir / "model.onnx"),
                inputs=[TensorSpec(f"t{i}", SHAPE, "FP32")],
                outputs=[TensorSpec(out_name, tuple(out_shape), "FP32")],
                opset=17,
            ),
            shard_dir,
        )
        dirs.append(shard_dir)
    return dirs


@dataclass
class _Chain:
    label: str
    processes: list[Any]
    http: list[str]
    infer: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
    live: Callable[[], bool]  # an empty call to the head: the gRPC round trip alone
    close: Callable[[], None]
    rounds: list[dict[str, float]] = field(default_factory=list)

    def counters(self) -> dict[str, float]:
        """Every counter of the shards' /metrics (µs and counts), summed over the shards."""
        from gpuflow.tasks.edge.serving.metrics import scrape_counters

        total: dict[str, float] = {}
        for i, (proc, address) in enumerate(zip(self.processes, self.http, strict=True)):
            try:
                scraped = scrape_counters(address)
            except OSError as exc:  # say which shard, and whether its process still runs
                code = proc.process.poll()
                state = "running" if code is None else f"exited with code {code}"
                raise RuntimeError(
                    f"hop bench ({self.label}): shard {i}'s /metrics at {address} failed "
                    f"({exc}); its process {proc.pid} is {state} (log {proc.log_path})"
                ) from exc
            for name, value in scraped.items():
                total[name] = total.get(name, 0.0) + value
        return total


def _start_chain(label: str, dirs: list[Path], shared_memory: str, cores: list[int]) -> _Chain:
    from gpuflow.tasks.edge.serving.client import OipClient
    from gpuflow.tasks.edge.serving.process import start_shard_process

    processes: list[Any] = []
    http: list[str] = []
    try:
        next_address, next_model = "", None
        for i, shard_dir in reversed(list(enumerate(dirs))):
            args = ["--intra-op-threads", "1", "--http-port", "0"]
            args += ["--shared-memory", shared_memory, "--log-level", "WARNING"]
            proc = start_shard_process(
                shard_dir, forward_to=next_address, forward_model=next_model, extra_args=args
            )
            processes.insert(0, proc)
            os.sched_setaffinity(proc.pid, {cores[i % len(cores)]})
            http.insert(0, proc.ready_line.split("http=")[1].split()[0])
            next_address, next_model = proc.address, proc.model_name
        # The first hop on a stream too, as the shards send theirs (and as tritonclient's
        # async_stream_infer does): what is timed is a hop of the chain, not a call set-up.
        client = OipClient(
            processes[0].address,
            timeout_s=60.0,
            shared_memory=shared_memory,  # type: ignore[arg-type]
            streaming=True,
        )
    except BaseException:
        for proc in processes:
            proc.stop()
        raise

    def infer(x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return client.infer("hop-shard0", x)

    def close() -> None:
        client.close()
        for proc in processes:
            proc.stop()

    return _Chain(label, processes, http, infer, client.server_live, close)


def _wait_stopped(pid: int, timeout_s: float = 2.0) -> None:
    """Until /proc shows ``pid`` stopped (state T), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                    return
        except (FileNotFoundError, ProcessLookupError):
            return  # gone: nothing left to wait for
        time.sleep(0.001)


@contextlib.contextmanager
def _others_stopped(chains: list[_Chain], timed: _Chain) -> Iterator[None]:
    """Every shard server of the chains other than ``timed`` stopped while it is timed."""
    pids = [p.pid for c in chains if c is not timed for p in c.processes]
    stopped = []
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        for pid in stopped:  # the signal is delivered asynchronously: wait until it took
            _wait_stopped(pid)
        yield
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _time_block(call: Callable[[], object], n: int) -> list[float]:
    latencies = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - t0)
    return latencies


def _measure_block(chain: _Chain, x: dict[str, np.ndarray], requests: int, k: int) -> None:
    """One block of ``requests`` on ``chain``; its figures appended to ``chain.rounds``."""
    from gpuflow.tasks.edge.serving.metrics import PHASE_COUNTERS, counter_sample

    before = chain.counters()
    lat = _time_block(lambda: chain.infer(x), requests)
    after = chain.counters()

    def delta(name: str) -> float:  # all shards together
        return after[counter_sample(name)] - before[counter_sample(name)]

    served = delta("nv_inference_exec_count") / k  # requests: each shard runs each once

    def per_request_ms(name: str) -> float:
        return delta(name) / 1e3 / served

    compute_ms = per_request_ms(PHASE_COUNTERS["infer"][0])
    forward_ms = per_request_ms(PHASE_COUNTERS["forward"][0])
    handled_ms = per_request_ms("nv_inference_request_duration_us")
    mean_ms = statistics.mean(lat) * 1e3
    chain.rounds.append(
        {
            "latency_mean_ms": mean_ms,
            "latency_p50_ms": statistics.median(lat) * 1e3,
            "compute_ms": compute_ms,
            "per_hop_ms": (mean_ms - compute_ms) / k,
            # Each shard's own time in its handler is its duration less its next hop's.
            "in_servers_per_hop_ms": (handled_ms - forward_ms - compute_ms) / k,
            "between_per_hop_ms": (mean_ms - handled_ms + forward_ms) / k,
        }
    )


def run(k: int = 4, requests: int = 100, rounds: int = 5, report: Report = print) -> dict[str, Any]:
    """Per-hop overhead of each transport at 1.6 MB; see the module docstring."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = list(range(os.cpu_count() or 1))
    root = Path(tempfile.mkdtemp(prefix="gpuflow-hop-bench-"))
    chains: list[_Chain] = []
    x = {"t0": np.random.default_rng(0).standard_normal(SHAPE, dtype=np.float32)}
    want = float(x["t0"].sum(dtype=np.float64))
    empty_ms: list[float] = []
    load_before = os.getloadavg()
    times_before = CpuTimes.now()
    try:
        dirs = _shard_models(k, root)
        for label, mode in TRANSPORTS.items():
            report(f"hop: start a {k}-shard chain ({label})")
            chains.append(_start_chain(label, dirs, mode, cores))
        for chain in chains:  # warm-up, and a check that the chain computes what it should
            for _ in range(5):
                got = float(chain.infer(x)["sum"][0])
            if not np.isclose(got, want, rtol=1e-4, atol=1e-2):
                raise RuntimeError(f"hop chain ({chain.label}) returned {got}, expected {want}")
        for r in range(rounds):
            report(f"hop: round {r + 1}/{rounds}, a block of {requests} requests per chain")
            # Alternate which chain goes first, so a drift in load within a round (or the
            # previous block's leftovers) does not always fall on the same one.
            for chain in chains if r % 2 == 0 else chains[::-1]:
                with _others_stopped(chains, chain):
                    _measure_block(chain, x, requests, k)
            shm_chain = next(c for c in chains if c.label == "shm")
            with _others_stopped(chains, shm_chain):
                empty_ms.append(statistics.mean(_time_block(shm_chain.live, requests)) * 1e3)
    finally:
        for chain in chains:
            chain.close()
        shutil.rmtree(root, ignore_errors=True)
    out: dict[str, Any] = {
        "tensor_bytes": int(np.prod(SHAPE)) * 4,
        "shards": k,
        "hops_per_request": k,
        "requests_per_round": requests,
        "rounds": rounds,
        "cores": len(cores),
        "load_avg_1m_before": load_before[0],
        **load_report(
            times_before, CpuTimes.now(), sorted({cores[i % len(cores)] for i in range(k)})
        ),
        # An empty unary call to the head and back: what any hop pays before a byte of work.
        "empty_rpc_ms": statistics.mean(empty_ms),
        "empty_rpc_ci95_ms": ci95(empty_ms),
    }
    for chain in chains:  # flat keys: the CLI prints one table row per figure
        hops = [r["per_hop_ms"] for r in chain.rounds]
        label = chain.label
        out[f"{label}_per_hop_ms"] = statistics.mean(hops)
        out[f"{label}_per_hop_ci95_ms"] = ci95(hops)
        out[f"{label}_chain_latency_ms"] = statistics.mean(
            r["latency_mean_ms"] for r in chain.rounds
        )
        out[f"{label}_compute_ms"] = statistics.mean(r["compute_ms"] for r in chain.rounds)
        # What to give an EdgeNode on this host as link_mb_s, so plans price a hop as measured.
        out[f"{label}_effective_link_mb_s"] = (
            out["tensor_bytes"] / 1e6 / (out[f"{label}_per_hop_ms"] / 1e3)
        )
        out[f"{label}_per_hop_ms_by_round"] = ", ".join(f"{h:.3f}" for h in hops)
        for part in ("in_servers", "between"):
            out[f"{label}_{part}_per_hop_ms"] = statistics.mean(
                r[f"{part}_per_hop_ms"] for r in chain.rounds
            )
    out["goal_per_hop_ms"] = 1.0
    # Met only if the whole interval lies at or under the goal, not just the mean.
    out["shm_meets_goal"] = out["shm_per_hop_ms"] + out["shm_per_hop_ci95_ms"] <= 1.0
    return out
