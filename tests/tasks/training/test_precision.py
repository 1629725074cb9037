"""AutoPrecision: capability detection, policy validation, hysteresis, guard, checkpoints."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch
from gpuflow.hardware.skus import sku
from gpuflow.tasks.training import precision
from gpuflow.tasks.training.precision import (
    AutoPrecision,
    PrecisionError,
    Switch,
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
        AutoPrecision("bf16", CPU)


def test_validate_returns_policy_dtype(cpu_bf16: None) -> None:
    assert validate_policy("fp32", CPU) is None
    assert validate_policy("bf16", CPU) == torch.bfloat16
    assert validate_policy("fp16", CPU) == torch.float16
    assert validate_policy("auto", CPU, sku("v100")) == torch.float16


def test_bad_config_rejected(cpu_bf16: None) -> None:
    with pytest.raises(ValueError, match="hysteresis"):
        AutoPrecision("auto", CPU, up_threshold=0.6, down_threshold=0.6)
    with pytest.raises(ValueError, match="overflow_streak"):
        AutoPrecision("auto", CPU, overflow_streak=0)
    with pytest.raises(ValueError, match="spike_factor"):
        AutoPrecision("auto", CPU, spike_factor=1.0)


def test_bad_observe_input_rejected_without_change(cpu_bf16: None) -> None:
    ap = AutoPrecision("auto", CPU, min_dwell_steps=0)
    with pytest.raises(ValueError, match="percent"):
        ap.observe(0, 75.0, 1.0, False)
    assert ap.state_dict()["last_step"] is None
    ap.observe(3, 0.5, 1.0, False)
    with pytest.raises(ValueError, match="not after"):
        ap.observe(3, 0.5, 1.0, False)


# --- hysteresis and dwell ------------------------------------------------------------


def test_thresholds_and_none_utilization(cpu_bf16: None) -> None:
    ap = AutoPrecision("auto", CPU, min_dwell_steps=0)
    assert ap.current == "fp32"
    assert ap.observe(0, 0.70, 1.0, False) is None  # not strictly above up
    assert ap.observe(1, None, 1.0, False) is None
    sw = ap.observe(2, 0.71, 1.0, False)
    assert sw is not None and sw.to_dtype == torch.bfloat16 and "0.71 > up_threshold" in sw.reason
    assert ap.current_dtype == torch.bfloat16
    assert ap.observe(3, 0.65, 1.0, False) is None  # inside the hysteresis band
    assert ap.observe(4, 0.60, 1.0, False) is None
    assert ap.observe(5, None, 1.0, False) is None
    sw = ap.observe(6, 0.59, 1.0, False)
    assert sw is not None and sw.to_dtype == torch.float32
    assert ap.switches == [ap.switches[0], sw]


def test_dwell_blocks_early_switch(cpu_bf16: None) -> None:
    ap = AutoPrecision("auto", CPU, min_dwell_steps=20)
    assert ap.observe(0, 0.9, 1.0, False) is not None
    for step in range(1, 20):
        assert ap.observe(step, 0.1, 1.0, False) is None
    assert ap.observe(20, 0.1, 1.0, False) is not None


def _run_utilization_model(ap: AutoPrecision, util: dict[torch.dtype, float], steps: int) -> None:
    for step in range(steps):
        ap.observe(step, util[ap.current_dtype], 1.0, False)


def test_no_oscillation_when_bf16_lowers_utilization_into_band(cpu_bf16: None) -> None:
    # bf16 shortens kernels: NVML utilization drops 0.75 -> 0.65, inside the 0.6..0.7 band.
    ap = AutoPrecision("auto", CPU, min_dwell_steps=20)
    _run_utilization_model(ap, {torch.float32: 0.75, torch.bfloat16: 0.65}, 500)
    assert len(ap.switches) == 1
    assert ap.current == "bf16"


def test_switches_spaced_by_dwell_when_bf16_drops_below_down(cpu_bf16: None) -> None:
    ap = AutoPrecision("auto", CPU, min_dwell_steps=20)
    _run_utilization_model(ap, {torch.float32: 0.75, torch.bfloat16: 0.55}, 500)
    steps = [s.step for s in ap.switches]
    assert len(steps) >= 2
    assert all(b - a >= 20 for a, b in zip(steps, steps[1:], strict=False))
    assert len(steps) <= 500 // 20 + 1


def test_fixed_policies_ignore_utilization(cpu_bf16: None) -> None:
    for policy in ("fp32", "bf16", "fp16"):
        ap = AutoPrecision(policy, CPU, min_dwell_steps=0)
        start = ap.current
        for step in range(50):
            ap.observe(step, 0.0 if step % 2 else 1.0, 1.0, False)
        assert ap.current == start and ap.switches == []


def test_auto_without_reduced_dtype_stays_fp32(
    cpu_plain: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precision, "_cpu_autocast_accepts", lambda dtype: False)
    ap = AutoPrecision("auto", CPU, min_dwell_steps=0)
    assert ap.reduced_dtype is None
    for step in range(10):
        assert ap.observe(step, 1.0, 1.0, False) is None


# --- numeric guard -------------------------------------------------------------------


def test_nan_under_fixed_bf16_falls_back_and_returns(
    cpu_bf16: None, caplog: pytest.LogCaptureFixture
) -> None:
    ap = AutoPrecision("bf16", CPU, guard_cooldown_steps=10)
    caplog.set_level(logging.INFO, logger=LOGGER)
    sw = ap.observe(5, None, math.nan, False)
    assert sw is not None and sw.to_dtype == torch.float32 and "non-finite loss" in sw.reason
    assert any("non-finite" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)
    for step in range(6, 15):
        assert ap.observe(step, None, 1.0, False) is None
        assert ap.current == "fp32"
    sw = ap.observe(15, None, 1.0, False)
    assert sw is not None and sw.to_dtype == torch.bfloat16 and "cooldown over" in sw.reason


def test_overflow_streak_triggers_only_when_consecutive(cpu_bf16: None) -> None:
    ap = AutoPrecision("fp16", CPU, overflow_streak=3)
    ap.observe(0, None, 1.0, True)
    ap.observe(1, None, 1.0, True)
    ap.observe(2, None, 1.0, False)  # streak broken
    ap.observe(3, None, 1.0, True)
    assert ap.observe(4, None, 1.0, True) is None
    sw = ap.observe(5, None, 1.0, True)
    assert sw is not None and "3 GradScaler overflows" in sw.reason


def test_spike_falls_back_and_auto_returns_only_after_cooldown(cpu_bf16: None) -> None:
    ap = AutoPrecision("auto", CPU, min_dwell_steps=5, guard_cooldown_steps=30, spike_window=10)
    assert ap.observe(0, 0.9, 2.0, False) is not None  # up to bf16
    for step in range(1, 10):
        assert ap.observe(step, 0.9, 1.0 + 0.01 * step, False) is None
    assert ap.observe(10, 0.9, 3.1, False) is None  # just under 3 x median 1.05
    sw = ap.observe(11, 0.9, 10.0, False)
    assert sw is not None and "loss spike" in sw.reason and ap.current == "fp32"
    for step in range(12, 41):
        assert ap.observe(step, 0.9, 1.0, False) is None  # high utilization, but cooling
    sw = ap.observe(41, 0.9, 1.0, False)
    assert sw is not None and sw.to_dtype == torch.bfloat16


def test_guard_at_fp32_extends_cooldown_without_switch(cpu_bf16: None) -> None:
    ap = AutoPrecision("auto", CPU, min_dwell_steps=0, guard_cooldown_steps=10)
    assert ap.observe(0, 0.9, math.inf, False) is None
    assert ap.in_cooldown(9) and not ap.in_cooldown(10)
    assert ap.observe(5, 0.9, 1.0, False) is None
    assert ap.observe(10, 0.9, 1.0, False) is not None


# --- GradScaler and checkpoints ------------------------------------------------------


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def test_scaler_only_for_fp16(cpu_bf16: None) -> None:
    assert AutoPrecision("bf16", CPU).scaler is None
    assert AutoPrecision("auto", CPU).scaler is None  # bf16 preferred
    assert AutoPrecision("fp16", CPU).scaler is not None
    assert AutoPrecision("auto", CPU, sku("v100")).scaler is not None


def test_overflow_detected_and_scaler_survives_switch_round_trip(cpu_bf16: None) -> None:
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ap = AutoPrecision("auto", CPU, sku("v100"), min_dwell_steps=0, spike_window=50)
    ap.observe(0, 0.9, 1.0, False)
    assert ap.current == "fp16"
    x = torch.randn(4, 8)
    before = [p.detach().clone() for p in model.parameters()]
    with ap.autocast():
        loss = model(x).float().pow(2).mean() * 1e38  # scaled by 65536: inf grads
    ap.scale(loss).backward()
    ap.step(opt)
    assert ap.update() is True
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert ap.scaler is not None and ap.scaler.get_scale() == 32768.0

    ap.observe(1, 0.1, 1.0, True)  # down to fp32
    assert ap.current == "fp32"
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    assert ap.scale(loss) is loss
    loss.backward()
    ap.step(opt)
    assert ap.update() is False
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

    ap.observe(2, 0.9, 1.0, False)  # back to fp16: same scaler, same scale
    assert ap.current == "fp16" and ap.scaler.get_scale() == 32768.0


def test_state_dict_round_trip_resumes_identically(cpu_bf16: None) -> None:
    kwargs = dict(min_dwell_steps=3, guard_cooldown_steps=7, spike_window=5)
    util = [0.9, 0.9, 0.5, 0.5, 0.55, 0.9, 0.9, 0.2, 0.9, 0.9] * 6
    loss = [1.0 + 0.1 * (i % 3) for i in range(60)]
    loss[17] = math.nan
    overflow = [i % 4 == 1 for i in range(60)]
    sku_v100 = sku("v100")

    def run(ap: AutoPrecision, steps: range) -> list[Switch | None]:
        out = []
        for i in steps:
            with ap.autocast():
                pass
            out.append(ap.observe(i, util[i], loss[i], overflow[i]))
        return out

    straight = AutoPrecision("auto", CPU, sku_v100, **kwargs)
    # Give the scaler a non-default state so its round trip is visible.
    assert straight.scaler is not None
    straight.scaler.load_state_dict({**straight.scaler.state_dict(), "scale": 1024.0})
    expected = run(straight, range(60))

    first = AutoPrecision("auto", CPU, sku_v100, **kwargs)
    first.scaler.load_state_dict({**first.scaler.state_dict(), "scale": 1024.0})
    got = run(first, range(30))
    state = first.state_dict()
    resumed = AutoPrecision("auto", CPU, sku_v100, **kwargs)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    assert resumed.scaler is not None and resumed.scaler.state_dict()["scale"] == 1024.0
    got += run(resumed, range(30, 60))
    assert got == expected
    assert resumed.switches == straight.switches
    assert any("non-finite" in s.reason for s in straight.switches)


def test_load_state_dict_rejects_mismatch_before_change(cpu_bf16: None) -> None:
    ap = AutoPrecision("auto", CPU)
    state = AutoPrecision("bf16", CPU).state_dict()
    with pytest.raises(ValueError, match="policy 'bf16' differs"):
        ap.load_state_dict(state)
    other = AutoPrecision("auto", CPU, sku("v100")).state_dict()
    with pytest.raises(ValueError, match="reduced dtype fp16 differs from bf16"):
        ap.load_state_dict(other)
    assert ap.state_dict()["current"] == "fp32"


# --- a real (tiny) training loop -----------------------------------------------------


@pytest.mark.parametrize("twin", [None, "v100"])
def test_tiny_training_loop_auto_switches_and_trains(
    cpu_bf16: None, caplog: pytest.LogCaptureFixture, twin: str | None
) -> None:
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    ap = AutoPrecision("auto", CPU, sku(twin) if twin else None, min_dwell_steps=5)
    reduced = torch.float16 if twin else torch.bfloat16
    caplog.set_level(logging.INFO, logger=LOGGER)
    losses = []
    for step in range(30):
        opt.zero_grad()
        with ap.autocast():
            out = model(x)
            assert out.dtype == ap.current_dtype
            loss = torch.nn.functional.mse_loss(out.float(), y)
        ap.scale(loss).backward()
        ap.step(opt)
        overflowed = ap.update()
        losses.append(loss.item())
        # High utilization for 10 steps, then an input-bound phase.
        ap.observe(step, 0.9 if step < 10 else 0.3, loss.item(), overflowed)
    assert [(s.step, s.to_dtype) for s in ap.switches] == [(0, reduced), (10, torch.float32)]
    logged = [r.getMessage() for r in caplog.records if "precision switch" in r.getMessage()]
    assert len(logged) == 2 and "up_threshold" in logged[0] and "down_threshold" in logged[1]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]
