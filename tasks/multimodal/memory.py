"""Memory per rank, the way each kind of device can tell it.

On a GPU the caching allocator knows its peak (torch.cuda.max_memory_allocated). A CPU
has no such counter, so the meter counts what training holds for the model itself:
parameters, their gradients and the optimizer's state (exact, from the tensors), plus the
peak of what autograd saves for the backward pass (activation memory, the part gradient
checkpointing trades for recomputation), taken with saved-tensor hooks that sum the bytes
of each distinct storage saved during a step. The process's peak resident set size is
reported beside it; it also holds the interpreter, torch and the DataLoader's buffers.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterable, Iterator
from typing import Any

import torch


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def state_bytes(modules: Iterable[torch.nn.Module], optimizers: Iterable[Any]) -> int:
    """Parameters, buffers, gradients and optimizer state of the given parts."""
    total = 0
    for module in modules:
        total += tensor_bytes(module.parameters()) + tensor_bytes(module.buffers())
        total += tensor_bytes(p.grad for p in module.parameters() if p.grad is not None)
    for optimizer in optimizers:
        for state in optimizer.state.values():
            total += tensor_bytes(v for v in state.values() if isinstance(v, torch.Tensor))
    return total


class _Saved:
    """What autograd holds instead of a saved tensor while the meter runs: dropped when
    autograd frees it (after the backward pass that used it), and counted out then."""

    __slots__ = ("generation", "key", "meter", "tensor")

    def __init__(self, meter: ActivationMeter, tensor: torch.Tensor, key: int | None) -> None:
        self.meter, self.tensor, self.key = meter, tensor, key
        self.generation = meter.generation

    def __del__(self) -> None:
        # A graph that outlived its step (never backpropagated) must not count out a
        # later step's storage that reuses the address.
        if self.key is not None and self.generation == self.meter.generation:
            self.meter._release(self.key)


class ActivationMeter:
    """The peak bytes autograd keeps for backward inside ``step()``, over all steps.

    A storage saved twice (a weight used by two ops, a view) counts once; parameters are
    state, not activations. A checkpointed block keeps its input, not its insides
    (torch.utils.checkpoint saves through hooks of its own): ``keep`` counts such an input
    until the step ends. The transient recomputation of one block is not counted."""

    _active: ActivationMeter | None = None

    def __init__(self) -> None:
        self.peak_bytes = 0
        self._live: dict[int, list[int]] = {}  # storage address -> [references, bytes]
        self._live_bytes = 0
        self.generation = 0

    def _hold(self, tensor: torch.Tensor) -> int | None:
        if isinstance(tensor, torch.nn.Parameter) or tensor.device.type == "meta":
            return None
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        entry = self._live.setdefault(key, [0, storage.nbytes()])
        if entry[0] == 0:
            self._live_bytes += entry[1]
            self.peak_bytes = max(self.peak_bytes, self._live_bytes)
        entry[0] += 1
        return key

    def _release(self, key: int) -> None:
        entry = self._live.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self._live_bytes -= entry[1]
            del self._live[key]

    def _pack(self, tensor: torch.Tensor) -> _Saved:
        return _Saved(self, tensor, self._hold(tensor))

    @classmethod
    def keep(cls, tensor: torch.Tensor) -> None:
        """Count ``tensor`` as held until the running step ends (a checkpoint's input)."""
        if cls._active is not None:
            cls._active._hold(tensor)

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        self._live, self._live_bytes = {}, 0
        self.generation += 1
        ActivationMeter._active = self
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda s: s.tensor):
                yield
        finally:
            ActivationMeter._active = None
            self._live, self._live_bytes = {}, 0
            self.generation += 1


def peak_rss_bytes() -> int:
    """This process's peak resident set size (Linux reports kilobytes)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def memory_report(
    device: torch.device, modules: Iterable[torch.nn.Module], optimizers: Iterable[Any], meter
) -> dict[str, int]:
    """The figures a rank returns: what its parts hold, their activations' peak, and the
    device allocator's peak where there is one."""
    report = {
        "state_bytes": state_bytes(modules, optimizers),
        "activation_peak_bytes": meter.peak_bytes,
        "peak_rss_bytes": peak_rss_bytes(),
    }
    if device.type == "cuda":
        report["device_peak_bytes"] = int(torch.cuda.max_memory_allocated(device))
    return report
