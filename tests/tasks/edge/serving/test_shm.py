"""Tensors through shared memory (Triton's system shared-memory extension): the registry's
refusals, a client's slots, a forwarding chain that hands its boundary tensor through
shared memory, and the fall back to raw contents where a server cannot take it."""

from __future__ import annotations

import mmap
import os

import grpc
import numpy as np
import pytest
from gpuflow.tasks.edge.serving import shm
from gpuflow.tasks.edge.serving.client import OipClient, OipError
from gpuflow.tasks.edge.serving.codec import build_infer_request
from gpuflow.tasks.edge.serving.shm import RegionRegistry, SharedMemoryError, ShmTensorRef

X = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)


def _ours() -> set[str]:
    return {p.name for p in shm.SHM_DIR.glob(f"gpuflow-{os.getpid()}-*")}


@pytest.fixture
def key() -> str:
    """A 4 KiB shared-memory object of the test's own, with a known pattern."""
    name = f"gpuflow-test-{os.getpid()}-{os.urandom(4).hex()}"
    path = shm.SHM_DIR / name
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, 4096)
    with mmap.mmap(fd, 4096) as m:
        m[:8] = bytes(range(8))
    os.close(fd)
    yield "/" + name
    path.unlink(missing_ok=True)


def test_registry_reads_in_place_and_refuses_what_is_wrong(key: str) -> None:
    registry = RegionRegistry()
    registry.register("r", key, offset=4, byte_size=100)
    assert bytes(registry.view("r", 0, 4, "t")) == bytes(range(4, 8))
    assert registry.status() == [("r", key, 4, 100)]
    with pytest.raises(SharedMemoryError, match="already registered") as exc:
        registry.register("r", key, 0, 10)
    assert exc.value.code == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(SharedMemoryError, match=r"bytes \[96, 104\) lie outside .* 100 bytes"):
        registry.view("r", 96, 8, "t")
    with pytest.raises(SharedMemoryError, match="'nope' is not registered"):
        registry.view("nope", 0, 1, "t")
    with pytest.raises(SharedMemoryError, match="exceeds key .* of 4096 bytes"):
        registry.register("big", key, 0, 8192)
    with pytest.raises(SharedMemoryError, match="cannot open shared-memory key '/gpuflow-absent'"):
        registry.register("absent", "/gpuflow-absent", 0, 8)
    for bad in ("../etc/passwd", "/a/b", "", "/.."):
        with pytest.raises(SharedMemoryError, match="not a POSIX shm name"):
            registry.register("x", bad, 0, 8)
    with pytest.raises(SharedMemoryError) as missing:
        registry.status("nope")
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    view = registry.view("r", 0, 8, "t")  # a request in flight still holds the mapping
    registry.unregister("")
    assert registry.status() == []
    assert bytes(view[:4]) == bytes(range(4, 8))  # still readable until it lets go
    del view


def test_a_client_on_this_host_sends_inputs_through_shared_memory(mlp, mlp_whole) -> None:
    with OipClient(mlp_whole.address, shared_memory="auto") as client:
        out = client.infer("mlp-whole", {"x": X})
        regions = client.shared_memory_status()
        assert len(regions) == 1  # one slot, registered by this client
        (slot,) = regions
        assert slot in _ours()
        # A second request reuses the slot: nothing new is registered.
        client.infer("mlp-whole", {"x": X * 2})
        assert list(client.shared_memory_status()) == [slot]
    ref = mlp.reference({"x": X})
    np.testing.assert_array_equal(out["y"], ref["y"])
    assert slot not in _ours()  # close unlinks what it created
    with OipClient(mlp_whole.address) as probe:
        assert probe.shared_memory_status() == {}  # ... and unregisters it


def test_a_forwarding_chain_hands_its_boundary_tensors_through_shared_memory(
    mlp, mlp_forwarding
) -> None:
    with OipClient(mlp_forwarding[0].address, shared_memory="off") as client:
        out = client.infer("mlp-shard0", {"x": X})
        # Each hop registered a slot with the next shard: the tensors went through it.
        for server in mlp_forwarding[1:]:
            with OipClient(server.address, shared_memory="off") as probe:
                assert len(probe.shared_memory_status()) == 1
        assert mlp_forwarding[0].servicer.regions.status() == []  # the caller sent raw
    ref = mlp.reference({"x": X})
    np.testing.assert_array_equal(out["y"], ref["y"])
    np.testing.assert_array_equal(out["probs"], ref["probs"])


def test_a_forwarding_shard_has_its_model_write_into_the_next_hops_slot(
    mlp, start_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a signature's first request, onnxruntime writes a forwarding shard's outputs
    into the slot they are sent from: the boundary tensors are copied into shared memory
    once per forwarding shard, not once per request, and the answers stay the model's."""
    copies: list[str] = []
    write = shm._Slot.write

    def counted(self, arrays):
        copies.append(self.name)
        return write(self, arrays)

    monkeypatch.setattr(shm._Slot, "write", counted)
    tail = start_server(mlp.shard_dirs[2], forward_to="")
    middle = start_server(mlp.shard_dirs[1], forward_to=tail.address, forward_model="mlp-shard2")
    head = start_server(mlp.shard_dirs[0], forward_to=middle.address, forward_model="mlp-shard1")
    ref = mlp.reference({"x": X})
    with OipClient(head.address, shared_memory="off") as client:  # the first hop sends raw
        for i in range(4):
            out = client.infer("mlp-shard0", {"x": X * (i + 1)})
            want = mlp.reference({"x": X * (i + 1)})
            np.testing.assert_allclose(out["y"], want["y"], rtol=1e-6)
            np.testing.assert_allclose(out["probs"], want["probs"], rtol=1e-6)
        batch = client.infer("mlp-shard0", {"x": X[:2]})  # a new signature: copied once more
    np.testing.assert_allclose(batch["y"], ref["y"][:2], rtol=1e-6)
    assert len(copies) == 4  # two forwarding shards, two signatures each


def test_a_server_that_cannot_open_our_memory_gets_raw_contents_from_then_on(
    mlp, mlp_whole, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a server on another host answers (it has no such key): the client falls back
    once, for good, and the answer is the same."""
    calls: list[str] = []
    before = _ours()  # other tests' in-process servers may hold slots of their own

    def elsewhere(name: str, key: str, offset: int, byte_size: int) -> None:
        calls.append(name)
        raise SharedMemoryError(f"cannot open shared-memory key {key!r} on this host")

    monkeypatch.setattr(mlp_whole.servicer.regions, "register", elsewhere)
    with OipClient(mlp_whole.address, shared_memory="auto") as client:
        first = client.infer("mlp-whole", {"x": X})
        second = client.infer("mlp-whole", {"x": X})
    assert len(calls) == 1
    np.testing.assert_array_equal(first["y"], mlp.reference({"x": X})["y"])
    np.testing.assert_array_equal(second["y"], first["y"])
    assert _ours() == before  # the refused slot was unlinked
    with OipClient(mlp_whole.address, shared_memory="on") as strict:  # "on" does not hide it
        with pytest.raises(OipError, match="cannot open shared-memory key") as exc:
            strict.infer("mlp-whole", {"x": X})
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_bad_shared_memory_references_are_refused_by_name(mlp_whole) -> None:
    with OipClient(mlp_whole.address, shared_memory="off") as client:
        unknown = build_infer_request(
            "mlp-whole", {"x": X}, shm=[ShmTensorRef("nowhere", X.nbytes)]
        )
        with pytest.raises(OipError, match="region 'nowhere' is not registered") as exc:
            client.infer_request(unknown)
        assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
        short = build_infer_request("mlp-whole", {"x": X}, shm=[ShmTensorRef("r", 8)])
        with pytest.raises(OipError, match="shared memory holds 8 bytes .* needs 48 bytes"):
            client.infer_request(short)


def test_a_failed_request_drops_its_slot_instead_of_reusing_it(mlp_whole) -> None:
    """After an error the server may still be reading the slot (a deadline passed): the
    client never writes into it again."""
    with OipClient(mlp_whole.address, shared_memory="on") as client:
        client.infer("mlp-whole", {"x": X})
        (first,) = client.shared_memory_status()
        with pytest.raises(OipError, match="shape"):
            client.infer("mlp-whole", {"x": X[:, :3]})
        assert first not in client.shared_memory_status() and first not in _ours()
        client.infer("mlp-whole", {"x": X})
        (second,) = client.shared_memory_status()
        assert second != first


def test_a_restarted_server_gets_our_regions_again(mlp, start_server) -> None:
    """What a supervisor's restart looks like to the hop before: same address, a process
    that never saw our registrations. The client registers again and the call succeeds."""
    first = start_server(mlp.full_dir)
    port = first.port
    with OipClient(first.address, shared_memory="on") as client:
        client.infer("mlp-whole", {"x": X})
        (old,) = client.shared_memory_status()
        first.stop(grace_s=0)
        second = start_server(mlp.full_dir, port=port)
        out = client.infer("mlp-whole", {"x": X})
        (new,) = client.shared_memory_status()
        assert new != old and old not in _ours()
    np.testing.assert_array_equal(out["y"], mlp.reference({"x": X})["y"])
    assert second.servicer.regions.status() == []  # closed: unregistered
