"""A gang across nodes: one torchelastic agent per node (run_node_agent), each in its own
process with its own staging folder, as on two machines; rendezvous on loopback, hosted
by the first node's agent.

Asserted: two ranks on two agents train 20 steps to the very weights the one-node 2-rank
gang reaches (bit-equal: the same two per-rank gradients summed by one gloo all-reduce,
a + b, whichever node's rank comes first; every other input is identical); the committed
DCP checkpoint holds both ranks' shard files, each uploaded by its own rank from its own
node's folder (no folder holds the other's); the two-node step-10 checkpoint resumes on
one rank of one node (resharded), its losses continuing the two-node run's; and a rank
that dies at step 15 restarts both nodes' ranks from the step-10 commit (each node
fetching it for itself), bit-exact with the uninterrupted run, though the two agents'
restart counts differ. Few, short gangs: an agent and each rank cost seconds to start on this machine.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.tasks.training.checkpoint import LAYOUT_DCP, CheckpointManager
from gpuflow.tasks.training.distributed.launch import check_gang, run_gang, run_node_agent
from gpuflow.tasks.training.loop import trained_model
from gpuflow.tasks.training.spec import TrainSpec
from gpuflow.tasks.training.storage import LocalStorage

from tests.tasks.training.distributed.gang_helpers import (
    TWO_NODES,
    UNITS,
    dying_rank_main,
    gang_spec,
    run_nodes,
)

pytestmark = pytest.mark.integration
JOB = "nodes"
# Resumed runs take the same global batches from the same (resharded) state; one rank
# sums the batch's gradients in another order than two: ~1e-6 after 10 AdamW steps.
TOLERANCE = 1e-5


def _spec(steps: int) -> TrainSpec:
    return gang_spec(JOB, steps)


def _storage(root: Path) -> CheckpointStorage:
    return CheckpointStorage(path=str(root / "ck"))


def _weights(root: Path, steps: int) -> dict[str, torch.Tensor]:
    return trained_model(_spec(steps), LocalStorage(root / "ck")).state_dict()


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict]]:
    """2 ranks on 2 node agents (h0: twin-0, h1: twin-1), 20 steps, checkpoints at 10, 20."""
    root = tmp_path_factory.mktemp("two-nodes")
    results = run_nodes(_spec(20), _storage(root), TWO_NODES, root, fencing_token=5, record=True)
    return root, results


def test_two_node_agents_train_as_the_one_node_gang_does(two_nodes, tmp_path) -> None:
    root, results = two_nodes
    assert sorted(results) == [0, 1]
    assert {results[r]["resource_id"] for r in results} == {"twin-0", "twin-1"}
    assert all(r["steps_done"] == 20 and r["world_size"] == 2 for r in results.values())
    assert results[0]["backend"] == "gloo" and len(results[0]["losses"]) == 20
    # Each node's agent has rank 0's result, wherever rank 0 ran.
    assert all(r["rank0"]["rank"] == 0 for r in results.values())
    assert results[1]["rank0"]["losses"] == results[0]["losses"]
    one_node = run_gang(_spec(20), _storage(tmp_path), UNITS[:2], staging=tmp_path / "staging")
    assert one_node["steps_done"] == 20
    got, want = _weights(root, 20), _weights(tmp_path, 20)
    assert all(torch.equal(got[k], v) for k, v in want.items()), "not bit-equal"


def test_each_rank_uploads_its_own_shards_from_its_own_node(two_nodes, tmp_path) -> None:
    root, _ = two_nodes
    manager = CheckpointManager(LocalStorage(root / "ck"), JOB)
    committed = dict(manager.committed())
    assert sorted(committed) == ["step-000000010", "step-000000020"]
    for cid, manifest in committed.items():
        assert manifest["layout"] == LAYOUT_DCP and manifest["fencing_token"] == 5
        assert set(manifest["files"]) == {".metadata", "extra.pt", "__0_0.distcp", "__1_0.distcp"}
        manager.fetch(cid, tmp_path / cid)  # every file there, each matching its sha256
    # Each node staged in its own folder and cleared it once its uploads were done.
    for node in ("h0", "h1"):
        staged = root / f"staging-{node}" / JOB
        assert staged.is_dir() and not any(staged.iterdir()), list(staged.iterdir())


def test_a_two_node_checkpoint_resumes_on_one_rank_of_one_node(two_nodes, tmp_path) -> None:
    root, results = two_nodes
    shutil.copytree(root / "ck", tmp_path / "ck")
    shutil.rmtree(tmp_path / "ck" / JOB / "step-000000020")  # the run as it stood at 10
    out = run_gang(
        _spec(20), _storage(tmp_path), UNITS[:1], staging=tmp_path / "staging", record=True
    )
    # Resharded: one rank holds what two did.
    assert (out["resumed_from_step"], out["steps_done"], out["world_size"]) == (10, 20, 1)
    # The loss goes on where the two-node run's went: steps 11-20 alike.
    assert out["losses"] == pytest.approx(results[0]["losses"][10:], rel=TOLERANCE, abs=TOLERANCE)
    got, want = _weights(tmp_path, 20), _weights(root, 20)
    worst = max(float((got[k] - v).abs().max()) for k, v in want.items())
    assert worst < TOLERANCE, f"resumed on one rank of one node, drifts {worst:g}"


def test_a_rank_that_dies_restarts_both_nodes_from_their_last_commit(two_nodes, tmp_path) -> None:
    """Rank 0 dies at step 15; the other node's rank is healthy then, so its agent restarts
    it for the membership change without counting a restart: the two nodes' restart
    counts differ (0 and 1), and the new round still meets (a fresh store per round, not
    one keyed by a count). Each node fetches the step-10 checkpoint for itself."""
    root, _ = two_nodes
    results = run_nodes(
        _spec(20), _storage(tmp_path), TWO_NODES, tmp_path, entry=dying_rank_main, max_restarts=1
    )
    assert sorted(r["restart_count"] for r in results.values()) == [0, 1]
    assert all((r["resumed_from_step"], r["steps_done"]) == (10, 20) for r in results.values())
    got, want = _weights(tmp_path, 20), _weights(root, 20)
    assert all(torch.equal(got[k], v) for k, v in want.items()), "not bit-exact"


def test_a_gang_across_nodes_is_refused_where_it_cannot_run(tmp_path) -> None:
    spec = _spec(5)
    with pytest.raises(InvalidRequestError, match="run_node_agent on each node"):
        check_gang(spec, TWO_NODES)  # one agent cannot hold two nodes' units
    assert check_gang(spec, TWO_NODES, across_nodes=True) == {
        "h0": TWO_NODES[:1],
        "h1": TWO_NODES[1:],
    }
    with pytest.raises(InvalidRequestError, match="appear more than once"):
        check_gang(spec, [TWO_NODES[0], TWO_NODES[0]], across_nodes=True)
    for node, rendezvous, match in [
        ("h9", ("127.0.0.1", 29500), "node 'h9' has no unit"),
        ("h1", ("127.0.0.1", 0), "port in 1-65535"),
        ("h1", "127.0.0.1:29500", "is not \\(host, port\\)"),
    ]:
        with pytest.raises(InvalidRequestError, match=match):
            run_node_agent(spec, _storage(tmp_path), TWO_NODES, node, rendezvous, staging=tmp_path)


def test_ranks_upload_their_own_files_and_rank_0_commits_them_all(tmp_path) -> None:
    """CheckpointManager's two commit steps, as the ranks of two nodes use them: each
    uploads from a folder only it has, then one manifest (written last) lists them all."""
    manager = CheckpointManager(LocalStorage(tmp_path / "ck"), JOB, fencing_token=4)
    entries = {}
    for rank, name in enumerate(["__0_0.distcp", "__1_0.distcp"]):
        own = tmp_path / f"node-{rank}" / name
        own.parent.mkdir()
        own.write_bytes(bytes([rank]) * 100)
        entries[name] = manager.upload_file(7, name, own)
        assert not manager.committed()  # uploaded, not a checkpoint yet
    assert entries["__0_0.distcp"]["file"] != entries["__1_0.distcp"]["file"]
    assert manager.commit_manifest(7, entries) == "step-000000007"
    (_, manifest), *_ = manager.committed()
    assert manifest["files"] == entries and manifest["fencing_token"] == 4
    manager.fetch("step-000000007", tmp_path / "back")
    assert (tmp_path / "back" / "__1_0.distcp").read_bytes() == bytes([1]) * 100
    with pytest.raises(ValueError, match="plain name"):
        manager.upload_file(7, "a/b", tmp_path / "back" / "__1_0.distcp")
    with pytest.raises(ValueError, match="at least one file"):
        manager.commit_manifest(8, {})
