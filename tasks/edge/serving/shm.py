"""Tensors through POSIX shared memory: Triton's system shared-memory extension.

Where a client and a server share a host, a 1.6 MB activation need not cross gRPC at all:
the client writes it into a shared-memory object it registered with the server once
(``SystemSharedMemoryRegister``: a region name, the object's key such as ``/name``, an
offset and a size), and the request carries only the tensor's metadata and three
parameters, as Triton defines them:

- ``shared_memory_region``: the registered region's name;
- ``shared_memory_byte_size``: the tensor's size in bytes;
- ``shared_memory_offset``: where in the region it starts (default 0).

The same parameters on a requested output ask the server to write that output there.
tritonclient's ``tritonclient.utils.shared_memory`` speaks this to a gpuflow shard server
unchanged, and so does ``SlotPool`` below, which the forwarding shards use for the next hop
(client.py).

Server side, ``RegionRegistry`` maps registered regions (read and written in place: an input
array is a view of the mapping, never a copy). Client side, ``SlotPool`` keeps regions this
process created, one per request in flight, and hands a free one out per call: a slot is
reused only after the call that used it has returned, so a server is never reading a slot
that is being rewritten; a slot whose call failed (the server may still be reading it after a
deadline) is dropped, never reused. A producer that knows its outputs' shapes beforehand
(a forwarding shard, through onnxruntime's IOBinding) can ``reserve`` a slot and write into
it; arrays that already lie in a reserved slot are sent from where they lie, uncopied.
"""

from __future__ import annotations

import mmap
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np

SHM_DIR = Path("/dev/shm")  # where Linux keeps shm_open's objects
PARAM_REGION = "shared_memory_region"
PARAM_BYTE_SIZE = "shared_memory_byte_size"
PARAM_OFFSET = "shared_memory_offset"
_KEY = re.compile(r"^/?[A-Za-z0-9._-]{1,200}$")
_ALIGN = 64  # tensors start on cache-line boundaries inside a slot
# In the error for a region the server does not know; a client that sees it for its own
# region knows the server restarted and registers again.
UNREGISTERED_REGION = "is not registered here"


class SharedMemoryError(ValueError):
    """A region or shared-memory tensor is unknown, out of bounds or cannot be opened."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT):
        super().__init__(message)
        self.code = code


def key_path(key: str) -> Path:
    """The file behind a POSIX shm key ("/name" or "name"); SharedMemoryError if malformed."""
    if not isinstance(key, str) or not _KEY.match(key) or key.strip("/") in ("", ".", ".."):
        raise SharedMemoryError(
            f"shared-memory key {key!r} is not a POSIX shm name ('/name': letters, digits, "
            "'.', '_', '-')"
        )
    return SHM_DIR / key.lstrip("/")


@dataclass
class _Region:
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap

    def view(self, offset: int, byte_size: int, tensor: str) -> memoryview:
        if offset < 0 or byte_size < 0 or offset + byte_size > self.byte_size:
            raise SharedMemoryError(
                f"tensor {tensor!r}: bytes [{offset}, {offset + byte_size}) lie outside "
                f"shared-memory region {self.name!r} of {self.byte_size} bytes"
            )
        start = self.offset + offset
        return memoryview(self.mapping)[start : start + byte_size]


class RegionRegistry:
    """The system shared-memory regions registered with one server; thread-safe."""

    def __init__(self) -> None:
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()
        self._retired: list[mmap.mmap] = []  # still viewed by a request in flight

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise SharedMemoryError("a shared-memory region needs a name")
        path = key_path(key)
        if offset < 0 or byte_size <= 0:
            raise SharedMemoryError(
                f"region {name!r}: offset {offset} and byte_size {byte_size} must be >= 0 and > 0"
            )
        with self._lock:
            if name in self._regions:
                raise SharedMemoryError(
                    f"shared-memory region {name!r} is already registered",
                    grpc.StatusCode.ALREADY_EXISTS,
                )
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError as exc:
                raise SharedMemoryError(
                    f"region {name!r}: cannot open shared-memory key {key!r} on this host "
                    f"({exc.strerror})"
                ) from None
            try:
                size = os.fstat(fd).st_size
                if offset + byte_size > size:
                    raise SharedMemoryError(
                        f"region {name!r}: [{offset}, {offset + byte_size}) exceeds key {key!r} "
                        f"of {size} bytes"
                    )
                mapping = mmap.mmap(fd, offset + byte_size)
            finally:
                os.close(fd)  # the mapping keeps the object alive
            self._regions[name] = _Region(name, key, offset, byte_size, mapping)

    def unregister(self, name: str = "") -> None:
        """One region, or all of them when ``name`` is empty (as Triton does)."""
        with self._lock:
            names = [name] if name else list(self._regions)
            for n in names:
                region = self._regions.pop(n, None)
                if region is not None:
                    self._retire(region.mapping)

    def _retire(self, mapping: mmap.mmap) -> None:
        self._retired.append(mapping)
        still: list[mmap.mmap] = []
        for m in self._retired:
            try:
                m.close()
            except BufferError:  # an array of a request in flight still views it
                still.append(m)
        self._retired = still

    def status(self, name: str = "") -> list[tuple[str, str, int, int]]:
        """(name, key, offset, byte_size) of one region or all; NOT_FOUND for an unknown one."""
        with self._lock:
            if name and name not in self._regions:
                raise SharedMemoryError(
                    f"shared-memory region {name!r} is not registered", grpc.StatusCode.NOT_FOUND
                )
            chosen = [self._regions[name]] if name else list(self._regions.values())
            return [(r.name, r.key, r.offset, r.byte_size) for r in chosen]

    def view(self, region: str, offset: int, byte_size: int, tensor: str) -> memoryview:
        with self._lock:
            found = self._regions.get(region)
            if found is None:
                raise SharedMemoryError(
                    f"tensor {tensor!r}: shared-memory region {region!r} {UNREGISTERED_REGION}"
                )
            return found.view(offset, byte_size, tensor)

    def close(self) -> None:
        self.unregister("")


@dataclass(frozen=True)
class ShmTensorRef:
    """Where one tensor lies: the three parameters of the extension."""

    region: str
    byte_size: int
    offset: int = 0


def tensor_ref(parameters: object, tensor: str) -> ShmTensorRef | None:
    """The shared-memory parameters of a tensor message, or None if it has none."""
    params = parameters  # a protobuf map<string, InferParameter>
    if PARAM_REGION not in params:  # type: ignore[operator]
        return None
    region = params[PARAM_REGION].string_param  # type: ignore[index]
    if PARAM_BYTE_SIZE not in params:  # type: ignore[operator]
        raise SharedMemoryError(f"tensor {tensor!r}: {PARAM_REGION} without {PARAM_BYTE_SIZE}")
    size = int(params[PARAM_BYTE_SIZE].int64_param)  # type: ignore[index]
    offset = int(params[PARAM_OFFSET].int64_param) if PARAM_OFFSET in params else 0  # type: ignore[index,operator]
    return ShmTensorRef(region, size, offset)


def set_tensor_ref(parameters: object, ref: ShmTensorRef) -> None:
    params = parameters
    params[PARAM_REGION].string_param = ref.region  # type: ignore[index]
    params[PARAM_BYTE_SIZE].int64_param = ref.byte_size  # type: ignore[index]
    params[PARAM_OFFSET].int64_param = ref.offset  # type: ignore[index]


TensorLayout = tuple[np.dtype, tuple[int, ...]]  # one tensor's dtype and shape


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _nbytes(layout: TensorLayout) -> int:
    return int(np.prod(layout[1], dtype=np.int64)) * np.dtype(layout[0]).itemsize


class _Slot:
    """A shared-memory object this process created and owns (unlinked on close)."""

    def __init__(self, byte_size: int) -> None:
        self.name = f"gpuflow-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.key = "/" + self.name
        self.byte_size = byte_size
        fd = os.open(key_path(self.key), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, byte_size)
            self.mapping = mmap.mmap(fd, byte_size)
        except BaseException:
            os.unlink(key_path(self.key))
            raise
        finally:
            os.close(fd)
        probe = np.frombuffer(self.mapping, dtype=np.uint8)
        self.address = probe.ctypes.data  # where the mapping starts in this process
        del probe  # the mapping must carry no export when the slot closes

    def views(self, layouts: Sequence[TensorLayout]) -> list[np.ndarray]:
        """Writable arrays of these dtypes and shapes, each at an aligned offset."""
        arrays, offset = [], 0
        for dtype, shape in layouts:
            count = int(np.prod(shape, dtype=np.int64))
            arrays.append(
                np.frombuffer(self.mapping, dtype=dtype, count=count, offset=offset).reshape(shape)
            )
            offset += _aligned(_nbytes((dtype, shape)))
        return arrays

    def place_of(self, array: np.ndarray) -> ShmTensorRef | None:
        """Where ``array`` lies in this slot, if it is a contiguous array inside it."""
        start = array.__array_interface__["data"][0] - self.address
        inside = 0 <= start and start + array.nbytes <= self.byte_size
        if not inside or not array.flags.c_contiguous:
            return None
        return ShmTensorRef(self.name, array.nbytes, start)

    def write(self, arrays: Sequence[np.ndarray]) -> list[ShmTensorRef]:
        """Copy the arrays in, each at an aligned offset: the one copy of the fast path."""
        views = self.views([(a.dtype, a.shape) for a in arrays])
        for view, array in zip(views, arrays, strict=True):
            view[...] = array
        refs = [ShmTensorRef(self.name, v.nbytes, v.ctypes.data - self.address) for v in views]
        del views  # the mapping must carry no export when the slot closes
        return refs

    def close(self) -> None:
        try:
            self.mapping.close()
        except BufferError:
            pass  # an array still views it: unmapped when the last one goes
        finally:
            key_path(self.key).unlink(missing_ok=True)


def slot_bytes(arrays: Sequence[np.ndarray]) -> int:
    return layout_bytes([(a.dtype, a.shape) for a in arrays])


def layout_bytes(layouts: Sequence[TensorLayout]) -> int:
    return sum(_aligned(_nbytes(layout)) for layout in layouts) or _ALIGN


class Reservation:
    """A slot taken for a producer to write into (``arrays``); ``release`` gives it back."""

    def __init__(self, pool: SlotPool, slot: _Slot, layouts: Sequence[TensorLayout]) -> None:
        self._pool, self._slot = pool, slot
        self.arrays: list[np.ndarray] | None = slot.views(layouts)

    def release(self, reuse: bool) -> None:
        """Back to the pool (``reuse``: the call that sent it returned), else dropped: the
        server may still read it. The arrays must not be used after this."""
        self.arrays = None
        self._pool._end_reservation(self._slot, reuse)


class SlotPool:
    """Regions of this process registered with one server, one per request in flight.

    ``register(name, key, byte_size)`` and ``unregister(name)`` are the server's RPCs (the
    client passes its own). A slot too small for a request is replaced by a larger one.
    """

    def __init__(
        self,
        register: Callable[[str, str, int], None],
        unregister: Callable[[str], None],
    ) -> None:
        self._register, self._unregister = register, unregister
        self._free: list[_Slot] = []
        self._all: set[_Slot] = set()
        self._reserved: set[_Slot] = set()
        self._lock = threading.Lock()

    def reserve(self, layouts: Sequence[TensorLayout]) -> Reservation:
        """A free slot laid out for tensors of these dtypes and shapes, to be written by
        the caller and sent with ``slot`` (which then copies nothing)."""
        slot = self._take(layout_bytes(layouts))
        with self._lock:
            self._reserved.add(slot)
        return Reservation(self, slot, layouts)

    def _end_reservation(self, slot: _Slot, reuse: bool) -> None:
        with self._lock:
            self._reserved.discard(slot)
            if reuse:
                self._free.append(slot)
        if not reuse:
            self._drop(slot)

    def _already_placed(self, arrays: Sequence[np.ndarray]) -> list[ShmTensorRef] | None:
        """The places of arrays that all lie in one reserved slot, else None."""
        with self._lock:
            reserved = list(self._reserved)
        for slot in reserved:
            places = [slot.place_of(a) for a in arrays]
            if all(p is not None for p in places):
                return places  # type: ignore[return-value]
        return None

    @contextmanager
    def slot(self, arrays: Sequence[np.ndarray]) -> Iterator[list[ShmTensorRef]]:
        """The arrays written to a free slot; the slot is reused after the block only if it
        ended without an exception. Arrays that already lie in a reserved slot are sent
        from there (its reservation decides what becomes of it)."""
        placed = self._already_placed(arrays)
        if placed is not None:
            yield placed
            return
        need = slot_bytes(arrays)
        slot = self._take(need)
        try:
            refs = slot.write(arrays)
            yield refs
        except BaseException:
            self._drop(slot)
            raise
        with self._lock:
            self._free.append(slot)

    def _take(self, need: int) -> _Slot:
        with self._lock:
            for i, slot in enumerate(self._free):
                if slot.byte_size >= need:
                    return self._free.pop(i)
            small = self._free.pop() if self._free else None
        if small is not None:
            self._drop(small)
        slot = _Slot(max(need, 2 * (small.byte_size if small else 0)))
        try:
            self._register(slot.name, slot.key, slot.byte_size)
        except BaseException:
            slot.close()
            raise
        with self._lock:
            self._all.add(slot)
        return slot

    def _drop(self, slot: _Slot) -> None:
        with self._lock:
            self._all.discard(slot)
        try:
            self._unregister(slot.name)
        except Exception:  # noqa: BLE001 - the server may be gone; the object goes anyway
            pass
        slot.close()

    def server_forgot(self) -> None:
        """The server no longer knows our regions (it restarted): the idle slots go, the
        reserved ones (written, about to be sent again) are registered again."""
        with self._lock:
            slots, self._free = self._free, []
            reserved = list(self._reserved)
        for slot in slots:
            self._drop(slot)
        for slot in reserved:
            self._register(slot.name, slot.key, slot.byte_size)

    def close(self) -> None:
        with self._lock:
            slots, self._free = list(self._all), []
        for slot in slots:
            self._drop(slot)
