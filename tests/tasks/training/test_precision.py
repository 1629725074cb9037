"""Which training dtypes a device runs: CPU flags, CUDA capability, twin SKUs, policy validation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gpuflow.hardware.skus import sku
from gpuflow.tasks.training import precision
from gpuflow.tasks.training.precision import (
    PrecisionError,
    reduced_precision_for,
    supported_reduced_dtypes,
    validate_policy,
)

CPU = torch.device("cpu")
LOGGER = "gpuflow.tasks.training.precision"


def _cpuinfo(tmp_path: Path, flags: str) -> Path:
    p = tmp_path / "cpuinfo"
    p.write_text(f"processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu sse2 avx2 {flags}\n\n")
    return p


@pytest.fixture
def cpu_bf16(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the host CPU look like one with AVX512-BF16, wherever the tests run."""
    monkeypatch.setattr(precision, "CPUINFO_PATH", _cpuinfo(tmp_path, "avx512f avx512_bf16"))


@pytest.fixture
def cpu_plain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "CPUINFO_PATH", _cpuinfo(tmp_path, "avx512f"))


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """A CUDA device whose compute capability major the test sets."""
    cap = {"major": 8}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx=None: (cap["major"], 0))
    return cap


# --- capability detection ------------------------------------------------------------


def test_cpu_flags_pick_bf16(cpu_bf16: None) -> None:
    assert reduced_precision_for(CPU) == torch.bfloat16
    assert supported_reduced_dtypes("cpu") == (torch.bfloat16, torch.float16)


def test_amx_counts_as_bf16(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "CPUINFO_PATH", _cpuinfo(tmp_path, "amx_tile amx_bf16"))
    assert reduced_precision_for(CPU) == torch.bfloat16


def test_cpu_without_bf16_falls_to_fp16_or_none(
    cpu_plain: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch 2.13 autocasts fp16 on CPU (checked for real, not mocked).
    assert reduced_precision_for(CPU) == torch.float16
    monkeypatch.setattr(precision, "_cpu_autocast_accepts", lambda dtype: False)
    assert reduced_precision_for(CPU) is None


def test_unreadable_cpuinfo_falls_back_to_torch_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precision, "CPUINFO_PATH", tmp_path / "missing")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert precision.cpu_flags() is None
    assert reduced_precision_for(CPU) == torch.bfloat16
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert reduced_precision_for(CPU) == torch.float16


def test_cuda_ampere_bf16_volta_fp16(fake_cuda: dict[str, int]) -> None:
    assert reduced_precision_for(torch.device("cuda", 0)) == torch.bfloat16
    fake_cuda["major"] = 7
    assert reduced_precision_for("cuda:0") == torch.float16


def test_cuda_unavailable_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(PrecisionError, match="CUDA is not available"):
        reduced_precision_for("cuda:0")


def test_twin_sku_must_also_allow(cpu_bf16: None, fake_cuda: dict[str, int]) -> None:
    # A CPU-backed twin V100 job: the host has bf16, the SKU does not.
    assert reduced_precision_for(CPU, sku("v100")) == torch.float16
    assert reduced_precision_for("cuda:0", sku("v100")) == torch.float16
    assert reduced_precision_for(CPU, sku("a100-80gb")) == torch.bfloat16
    assert reduced_precision_for(CPU, sku("dcu-z100")) == torch.float16
    assert reduced_precision_for(CPU, sku("dcu-k100")) == torch.bfloat16


def test_other_device_types_have_none() -> None:
    assert reduced_precision_for("meta") is None


# --- validate_policy -----------------------------------------------------------------


def test_unknown_policy_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"'tf32'.*fp32, bf16, fp16, auto"):
        validate_policy("tf32", CPU)


def test_bf16_on_v100_names_sku_and_alternatives(cpu_bf16: None) -> None:
    with pytest.raises(PrecisionError) as e:
        validate_policy("bf16", CPU, sku("v100"))
    msg = str(e.value)
    assert "Tesla V100-SXM2-32GB" in msg and "no bf16" in msg and "fp32, fp16" in msg


def test_bf16_on_plain_cpu_names_missing_flags(cpu_plain: None) -> None:
    with pytest.raises(PrecisionError, match="AVX512-BF16"):
        validate_policy("bf16", CPU)


def test_validate_returns_policy_dtype(cpu_bf16: None) -> None:
    assert validate_policy("fp32", CPU) is None
    assert validate_policy("bf16", CPU) == torch.bfloat16
    assert validate_policy("fp16", CPU) == torch.float16
    assert validate_policy("auto", CPU, sku("v100")) == torch.float16
