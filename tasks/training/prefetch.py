"""Batches on the device one step ahead: pinned host memory, a side-stream copy.

On a GPU the host-to-device copy of the next batch can run while this step computes,
but only from page-locked (pinned) memory and on a stream other than the compute stream;
the compute stream then waits for exactly that copy before it uses the batch. On a CPU
there is nothing to overlap, and the loop reads the sampler directly.

The checkpoint must not see the batch fetched ahead: ``state_dict`` is the sampler's
position *before* it, so a resume replays that batch and stays exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

Batch = tuple[torch.Tensor, torch.Tensor]


class DevicePrefetcher:
    """Wraps a resumable sampler (``__next__``, ``state_dict``, ``load_state_dict``)."""

    def __init__(self, sampler: Any, device: torch.device) -> None:
        self.sampler = sampler
        self.device = device
        self._cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device) if self._cuda else None
        self._ahead: tuple[dict[str, Any], Batch] | None = None  # (state before it, batch)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def _fetch(self) -> None:
        state = self.sampler.state_dict()
        x, y = next(self.sampler)
        if self._stream is not None:
            with torch.cuda.stream(self._stream):
                x = x.pin_memory().to(self.device, non_blocking=True)
                y = y.pin_memory().to(self.device, non_blocking=True)
        else:
            x, y = x.to(self.device), y.to(self.device)
        self._ahead = (state, (x, y))

    def __next__(self) -> Batch:
        if self._ahead is None:
            self._fetch()
        assert self._ahead is not None
        _, (x, y) = self._ahead
        if self._stream is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self._stream)
            # The tensors were allocated on the side stream; tell the caching allocator the
            # compute stream uses them, so their memory is not reused under it.
            x.record_stream(current)
            y.record_stream(current)
        self._fetch()  # the next batch's copy overlaps this step
        return x, y

    def state_dict(self) -> dict[str, Any]:
        """The sampler's position before the batch fetched ahead (if any)."""
        return self._ahead[0] if self._ahead is not None else self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)  # checked by the sampler before it changes
        self._ahead = None
