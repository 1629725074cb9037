"""The reduced precision this machine's CPU trains in natively: bf16 with AVX512-BF16 or
AMX, else fp16 (emulated). Tests that compare a reduced policy against fp32 ask for this
one, so that they run on any CI machine instead of only on CPUs with native bf16."""

from __future__ import annotations

from gpuflow.tasks.training.precision import dtype_name, reduced_precision_for


def cpu_reduced_policy() -> str:
    dtype = reduced_precision_for("cpu")
    if dtype is None:
        raise RuntimeError("this torch build can autocast to neither bf16 nor fp16 on CPU")
    return dtype_name(dtype)
