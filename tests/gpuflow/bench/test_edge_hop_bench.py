"""The per-hop bench runs real shard processes both ways and accounts for what it measured:
the chains compute the right sum (checked inside), the shards' own compute is subtracted,
and shared memory leaves nothing behind in /dev/shm."""

from __future__ import annotations

import pytest
from gpuflow.tasks.edge.serving import shm

from gpuflow.bench import edge_hop_bench


@pytest.mark.slow
def test_hop_bench_measures_both_transports_and_cleans_up() -> None:
    before = set(shm.SHM_DIR.glob("gpuflow-*"))
    out = edge_hop_bench.run(k=2, requests=3, rounds=2, report=lambda _: None)
    assert out["tensor_bytes"] == 512 * 28 * 28 * 4 and out["hops_per_request"] == 2
    for label in ("raw", "shm"):
        assert len(out[f"{label}_per_hop_ms_by_round"].split(", ")) == 2
        # Latency is more than the shards' compute, and the hop cost is what is left.
        latency, compute = out[f"{label}_chain_latency_ms"], out[f"{label}_compute_ms"]
        assert 0 < compute < latency
        assert out[f"{label}_per_hop_ms"] == pytest.approx((latency - compute) / 2)
        # The hop splits into the servers' own work and the way between the processes.
        inside, between = out[f"{label}_in_servers_per_hop_ms"], out[f"{label}_between_per_hop_ms"]
        assert inside > 0 and between > 0
        assert inside + between == pytest.approx(out[f"{label}_per_hop_ms"])
    assert isinstance(out["shm_meets_goal"], bool)
    assert set(shm.SHM_DIR.glob("gpuflow-*")) <= before  # every slot unlinked


def _state(pid: int) -> str:
    """The process's state letter from /proc (T: stopped)."""
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]


def test_the_chain_not_timed_is_stopped_while_the_other_is_timed_and_resumed_after() -> None:
    import subprocess
    import sys
    from types import SimpleNamespace

    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in "abc"]
    try:
        timed = SimpleNamespace(processes=procs[:1])
        other = SimpleNamespace(processes=procs[1:])
        chains = [timed, other]
        with pytest.raises(RuntimeError, match="inside"):
            with edge_hop_bench._others_stopped(chains, timed):  # type: ignore[arg-type]
                assert [_state(p.pid) for p in procs[1:]] == ["T", "T"]
                assert _state(procs[0].pid) != "T"
                raise RuntimeError("inside")
        # Resumed even though the block raised: nothing is left stopped.
        assert all(_state(p.pid) != "T" for p in procs)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_shard_whose_metrics_fail_is_named_with_its_process_state(tmp_path) -> None:
    import socket
    import subprocess
    import sys

    from gpuflow.tasks.edge.serving.process import ShardProcess

    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    shard = ShardProcess(dead, "127.0.0.1:1", "m", tmp_path / "shard.log", "READY")  # type: ignore[arg-type]
    chain = edge_hop_bench._Chain("shm", [shard], [address], dict, lambda: True, lambda: None)
    with pytest.raises(RuntimeError, match=r"shard 0's /metrics at .* exited with code 3"):
        chain.counters()
