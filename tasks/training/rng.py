"""Every global RNG a training step draws from (python, numpy, torch CPU, torch CUDA), in
torch.load-safe types, so a resumed run draws what an uninterrupted one would have."""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)


def capture_rng_state() -> dict[str, Any]:
    """Every global RNG (python, numpy, torch CPU, torch CUDA) in torch.load-safe types."""
    bit_generator, key, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": str(bit_generator),
            "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
        "torch_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back what ``capture_rng_state`` returned; raises before changing anything if
    the dict is incomplete."""
    missing = {"python", "numpy", "torch"} - set(state)
    if missing:
        raise ValueError(f"RNG state lacks {sorted(missing)}")
    numpy_state = state["numpy"]
    np_tuple = (
        numpy_state["bit_generator"],
        np.asarray(torch.as_tensor(numpy_state["key"]).numpy(), dtype=np.uint32),
        int(numpy_state["pos"]),
        int(numpy_state["has_gauss"]),
        float(numpy_state["cached_gaussian"]),
    )
    python_state = state["python"]
    if isinstance(python_state, list):  # JSON or other round trips turn tuples into lists
        python_state = (python_state[0], tuple(python_state[1]), python_state[2])
    random.setstate(python_state)
    np.random.set_state(np_tuple)
    torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8).cpu())
    cuda_states = state.get("torch_cuda") or []
    if cuda_states and torch.cuda.is_available():
        count = torch.cuda.device_count()
        if len(cuda_states) != count:
            log.warning(
                "checkpoint has CUDA RNG state for %d devices, this process sees %d; "
                "restoring the first %d (resume is not bit-exact across device counts)",
                len(cuda_states),
                count,
                min(count, len(cuda_states)),
            )
        for index, cuda_state in enumerate(cuda_states[:count]):
            torch.cuda.set_rng_state(torch.as_tensor(cuda_state, dtype=torch.uint8).cpu(), index)
    elif cuda_states:
        log.warning("checkpoint has CUDA RNG state but CUDA is not available; not restored")
