"""Training jobs here are toy-sized: one torch thread runs them fastest, and keeps them
fast when other work shares the cores (intra-op threads spin under contention)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
