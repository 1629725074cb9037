"""Hand one shard's outputs to the next shard's inputs.

Shards cut with ``onnx.utils.extract_model`` keep the boundary tensor's name on both sides,
so outputs map to inputs by name. Shards whose boundary was renamed (or exported
separately) map by position when the counts agree. Anything else is a chain that was wired
wrong, reported with both name lists rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


class HandoffError(ValueError):
    """A shard's outputs cannot be matched to the next shard's inputs."""


def map_outputs_to_inputs(
    outputs: Mapping[str, np.ndarray], input_names: Sequence[str]
) -> dict[str, np.ndarray]:
    """The next shard's inputs, by name, built from this shard's outputs (in output order)."""
    names = list(input_names)
    if not names:
        raise HandoffError("the next shard declares no inputs")
    if all(name in outputs for name in names):
        return {name: outputs[name] for name in names}
    if len(outputs) == len(names):
        return dict(zip(names, outputs.values(), strict=True))
    raise HandoffError(
        f"cannot hand outputs {list(outputs)} to inputs {names}: names differ and the counts "
        f"({len(outputs)} vs {len(names)}) do not allow a positional match"
    )
