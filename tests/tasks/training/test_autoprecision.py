"""AutoPrecision: ``auto`` decides on a timed A/B, utilization only triggers one, the
numeric guard falls back, the GradScaler survives switches, and the state resumes exactly.

Step times are given by the test (a table per dtype), so every decision here is
deterministic; the loop-level tests time real steps.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch
from gpuflow.hardware.skus import sku
from gpuflow.tasks.training import precision
from gpuflow.tasks.training.ab_probe import ProbeConfig
from gpuflow.tasks.training.autoprecision import (
    AFTER_GUARD,
    FIRST_PROBE,
    NO_EVIDENCE,
    AutoPrecision,
    Switch,
)

CPU = torch.device("cpu")
FP32, BF16, FP16 = torch.float32, torch.bfloat16, torch.float16
LOGGER = "gpuflow.tasks.training.autoprecision"
FAST_BF16 = {FP32: 1.0, BF16: 0.6, FP16: 0.6}
SLOW_FP16 = {FP32: 1.0, BF16: 0.6, FP16: 1.5}  # fp16 emulated on a CPU


@pytest.fixture(autouse=True)
def cpu_bf16(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the host CPU look like one with AVX512-BF16, wherever the tests run."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16\n")
    monkeypatch.setattr(precision, "CPUINFO_PATH", info)


def drive(
    ap: AutoPrecision,
    steps: range,
    times: dict[torch.dtype, float] | None,
    util: float | None | list[float | None] = None,
    loss: float | dict[int, float] = 1.0,
) -> list[Switch]:
    """Observe ``steps`` (1-based, as the loop counts), each taking ``times`` of the dtype
    it ran in (None: untimed); return the switches they caused."""
    out = []
    for i, step in enumerate(steps):
        u = util[i] if isinstance(util, list) else util
        lv = loss.get(step, 1.0) if isinstance(loss, dict) else loss
        t = times[ap.current_dtype] if times is not None else None
        sw = ap.observe(step, u, lv, False, step_time_s=t)
        if sw is not None:
            out.append(sw)
    return out


def _path(switches: list[Switch]) -> list[tuple[int, str]]:
    return [(s.step, precision.dtype_name(s.to_dtype)) for s in switches]


# --- the A/B decides -----------------------------------------------------------------


def test_auto_adopts_bf16_only_after_timing_both() -> None:
    ap = AutoPrecision("auto", CPU)
    switches = drive(ap, range(1, 31), FAST_BF16)
    # Warm-up (3 steps), then blocks of 1 untimed + 4 timed steps: fp32 bf16 fp32 bf16.
    assert _path(switches) == [(8, "bf16"), (13, "fp32"), (18, "bf16")]
    assert all("A/B (first A/B): timing" in s.reason for s in switches)
    [d] = ap.decisions
    assert (d.trigger, d.first_step, d.last_step, d.chosen) == (FIRST_PROBE, 4, 23, "bf16")
    assert d.timed_steps == 8 and d.speedup == pytest.approx(1 / 0.6)
    assert ap.current == "bf16" and not ap.probing


def test_on_a_v100_twin_auto_stays_fp32_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    ap = AutoPrecision("auto", CPU, sku("v100"))
    assert ap.reduced_dtype == FP16
    caplog.set_level(logging.INFO, logger=LOGGER)
    switches = drive(ap, range(1, 40), SLOW_FP16)
    assert _path(switches)[-1] == (23, "fp32") and ap.current == "fp32"
    [d] = ap.decisions
    assert d.chosen == "fp32" and d.candidate == "fp16" and d.speedup == pytest.approx(1 / 1.5)
    assert "slower" in d.reason and "staying fp32" in d.reason and switches[-1].reason == d.reason
    assert any("staying fp32" in r.getMessage() for r in caplog.records)


def test_a_candidate_far_slower_is_not_timed_a_second_round() -> None:
    # fp16 emulated on a CPU: ~12x slower. One block of each arm is evidence enough.
    ap = AutoPrecision("auto", CPU, sku("v100"))
    switches = drive(ap, range(1, 30), {FP32: 1.0, FP16: 12.0})
    assert _path(switches) == [(8, "fp16"), (13, "fp32")]
    [d] = ap.decisions
    assert (d.last_step, d.timed_steps, d.chosen) == (13, 4, "fp32")
    assert "not timed again at 2x or worse" in d.reason


def test_a_gain_under_min_gain_is_not_taken() -> None:
    ap = AutoPrecision("auto", CPU, probe=ProbeConfig(min_gain=0.1))
    drive(ap, range(1, 40), {FP32: 1.0, BF16: 0.95})
    assert ap.current == "fp32" and ap.decisions[0].chosen == "fp32"


def test_without_utilization_readings_auto_still_probes() -> None:
    # NVML reports no utilization on a MIG instance: the A/B does not need it.
    ap = AutoPrecision("auto", CPU, sku("a100-40gb"))
    drive(ap, range(1, 30), FAST_BF16, util=None)
    assert ap.current == "bf16"


def test_untimed_steps_neither_start_nor_advance_a_probe() -> None:
    ap = AutoPrecision("auto", CPU)
    assert drive(ap, range(1, 50), None) == [] and not ap.probing
    drive(ap, range(50, 52), FAST_BF16)
    assert ap.probing
    position = ap.state_dict()["probe"]["position"]
    drive(ap, range(52, 60), None)
    assert ap.state_dict()["probe"]["position"] == position


# --- what starts another A/B ---------------------------------------------------------


def test_utilization_triggers_a_probe_after_the_dwell_but_does_not_decide() -> None:
    ap = AutoPrecision("auto", CPU, min_dwell_s=10.0, utilization_delta=0.25)
    drive(ap, range(1, 24), FAST_BF16, util=0.95)
    assert ap.current == "bf16" and len(ap.decisions) == 1
    # Utilization falls (a neighbour left, or bf16 shortened the kernels): within the dwell
    # (10 s = 16 bf16 steps) nothing happens.
    drive(ap, range(24, 40), FAST_BF16, util=0.3)
    assert not ap.probing and len(ap.decisions) == 1
    drive(ap, range(40, 42), FAST_BF16, util=0.3)
    assert ap.probing and "utilization 0.95 -> 0.30" in ap.state_dict()["probe"]["trigger"]
    drive(ap, range(42, 70), FAST_BF16, util=0.3)
    # Low utilization, but bf16 still measures faster: it stays.
    assert len(ap.decisions) == 2 and ap.decisions[1].chosen == "bf16" and ap.current == "bf16"


def test_a_long_dwell_probes_again() -> None:
    ap = AutoPrecision("auto", CPU, reprobe_after_s=30.0)
    drive(ap, range(1, 24), FAST_BF16)
    drive(ap, range(24, 24 + 49), FAST_BF16)  # 48 bf16 steps: 28.8 s
    assert not ap.probing
    drive(ap, range(73, 76), FAST_BF16)
    assert ap.probing and "s of training since the last A/B" in ap.state_dict()["probe"]["trigger"]


def test_fixed_policies_never_probe_or_switch() -> None:
    for policy in ("fp32", "bf16", "fp16"):
        ap = AutoPrecision(policy, CPU)
        start = ap.current
        drive(ap, range(1, 60), SLOW_FP16, util=[0.0, 1.0] * 30)
        assert ap.current == start and ap.switches == [] and ap.decisions == []


def test_auto_without_reduced_dtype_stays_fp32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = tmp_path / "plain"
    plain.write_text("flags : avx512f\n")
    monkeypatch.setattr(precision, "CPUINFO_PATH", plain)
    monkeypatch.setattr(precision, "_cpu_autocast_accepts", lambda dtype: False)
    ap = AutoPrecision("auto", CPU)
    assert ap.reduced_dtype is None
    assert drive(ap, range(1, 30), FAST_BF16, util=1.0) == [] and ap.decisions == []


# --- the numeric guard -----------------------------------------------------------------


def test_nan_under_fixed_bf16_falls_back_and_returns(caplog: pytest.LogCaptureFixture) -> None:
    ap = AutoPrecision("bf16", CPU, guard_cooldown_steps=10)
    caplog.set_level(logging.INFO, logger=LOGGER)
    sw = ap.observe(5, None, math.nan, False)
    assert sw is not None and sw.to_dtype == FP32 and "non-finite loss" in sw.reason
    assert any("non-finite" in r.getMessage() for r in caplog.records)
    assert drive(ap, range(6, 15), None) == [] and ap.current == "fp32"
    sw = ap.observe(15, None, 1.0, False)
    assert sw is not None and sw.to_dtype == BF16 and "cooldown over" in sw.reason


def test_overflow_streak_triggers_only_when_consecutive() -> None:
    ap = AutoPrecision("fp16", CPU, overflow_streak=3)
    for step, overflowed in enumerate([True, True, False, True, True], start=1):
        assert ap.observe(step, None, 1.0, overflowed) is None
    sw = ap.observe(6, None, 1.0, True)
    assert sw is not None and "3 GradScaler overflows" in sw.reason


def test_a_spike_ends_bf16_and_auto_probes_again_after_the_cooldown() -> None:
    ap = AutoPrecision("auto", CPU, guard_cooldown_steps=30, spike_window=10)
    drive(ap, range(1, 30), FAST_BF16)
    assert ap.current == "bf16"
    sw = ap.observe(30, None, 10.0, False, step_time_s=0.6)
    assert sw is not None and "loss spike" in sw.reason and ap.current == "fp32"
    drive(ap, range(31, 60), FAST_BF16)
    assert not ap.probing  # cooling down in fp32
    drive(ap, range(60, 61), FAST_BF16)
    assert ap.probing and ap.state_dict()["probe"]["trigger"] == AFTER_GUARD
    drive(ap, range(61, 90), FAST_BF16)
    assert ap.current == "bf16" and [d.trigger for d in ap.decisions] == [FIRST_PROBE, AFTER_GUARD]


def test_the_guard_aborts_a_probe_in_flight() -> None:
    ap = AutoPrecision("auto", CPU, guard_cooldown_steps=5)
    drive(ap, range(1, 10), FAST_BF16)  # in the probe's bf16 block
    assert ap.probing and ap.current == "bf16"
    sw = ap.observe(10, None, math.nan, False, step_time_s=0.6)
    assert sw is not None and sw.to_dtype == FP32 and not ap.probing
    assert ap.decisions[-1].chosen == "fp32" and "aborted" in ap.decisions[-1].reason


def test_a_skipped_step_is_logged_and_falls_back() -> None:
    ap = AutoPrecision("bf16", CPU, guard_cooldown_steps=3)
    sw = ap.observe(4, None, 1.0, False, skipped="non-finite gradient norm inf")
    assert sw is not None and "step skipped" in sw.reason
    assert [(s.step, s.precision) for s in ap.skips] == [(4, "bf16")]


# --- GradScaler and checkpoints ------------------------------------------------------


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def test_scaler_only_for_fp16() -> None:
    assert AutoPrecision("bf16", CPU).scaler is None
    assert AutoPrecision("auto", CPU).scaler is None  # bf16 preferred
    assert AutoPrecision("fp16", CPU).scaler is not None
    assert AutoPrecision("auto", CPU, sku("v100")).scaler is not None


def test_overflow_detected_and_scaler_survives_a_fallback_round_trip() -> None:
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ap = AutoPrecision("fp16", CPU, guard_cooldown_steps=1)
    x = torch.randn(4, 8)
    before = [p.detach().clone() for p in model.parameters()]
    with ap.autocast():
        loss = model(x).float().pow(2).mean() * 1e38  # scaled by 65536: inf grads
    ap.scale(loss).backward()
    ap.step(opt)
    assert ap.update() is True
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert ap.scaler is not None and ap.scaler.get_scale() == 32768.0

    ap.observe(1, None, math.nan, True)  # the guard: down to fp32
    assert ap.current == "fp32"
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    assert ap.scale(loss) is loss
    loss.backward()
    ap.step(opt)
    assert ap.update() is False
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

    ap.observe(2, None, 1.0, False)  # cooldown over: fp16 again, same scaler, same scale
    assert ap.current == "fp16" and ap.scaler.get_scale() == 32768.0


def test_state_dict_round_trip_resumes_identically_mid_probe() -> None:
    kwargs = dict(guard_cooldown_steps=7, spike_window=5, reprobe_after_s=20.0)
    util = [0.9, 0.9, 0.5, 0.5, 0.55, 0.9, 0.9, 0.2, 0.9, 0.9] * 8
    losses = {20: math.nan, 52: 40.0}
    v100 = sku("v100")

    def run(ap: AutoPrecision, steps: range) -> list[Switch]:
        return drive(ap, steps, {FP32: 1.0, FP16: 0.7}, util=util[steps.start - 1 :], loss=losses)

    straight = AutoPrecision("auto", CPU, v100, **kwargs)
    assert straight.scaler is not None
    straight.scaler.load_state_dict({**straight.scaler.state_dict(), "scale": 1024.0})
    expected = run(straight, range(1, 81))

    first = AutoPrecision("auto", CPU, v100, **kwargs)
    first.scaler.load_state_dict({**first.scaler.state_dict(), "scale": 1024.0})
    got = run(first, range(1, 11))
    assert first.probing  # cut in the middle of an A/B
    state = first.state_dict()
    resumed = AutoPrecision("auto", CPU, v100, **kwargs)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    assert resumed.scaler is not None and resumed.scaler.state_dict()["scale"] == 1024.0
    got += run(resumed, range(11, 81))
    assert got == expected and resumed.decisions == straight.decisions
    assert len(straight.decisions) >= 2  # the cut probe, and at least one more after
    assert any("non-finite" in s.reason for s in straight.switches)


def test_a_resume_elsewhere_probes_again() -> None:
    a100 = AutoPrecision("auto", CPU, sku("a100-40gb"))
    drive(a100, range(1, 30), FAST_BF16)
    state = a100.state_dict()
    # Moved to a V100 (fp16 only): the bf16 it was in cannot run there; it resumes in fp32
    # and times fp16 before it takes it.
    v100 = AutoPrecision("auto", CPU, sku("v100"))
    v100.load_state_dict(state)
    assert v100.current == "fp32"
    drive(v100, range(30, 31), SLOW_FP16)
    trigger = v100.state_dict()["probe"]["trigger"]
    assert (
        "resumed on cpu (SKU Tesla V100-SXM2-32GB)" in trigger
        and "was cpu (SKU NVIDIA A100" in trigger
    )
    drive(v100, range(31, 60), SLOW_FP16)
    assert v100.current == "fp32" and v100.decisions[-1].candidate == "fp16"
    # A resize (same device, another world size) keeps bf16 and looks again.
    two = AutoPrecision("auto", CPU, sku("a100-40gb"), world_size=2)
    two.load_state_dict(state)
    assert two.current == "bf16"
    drive(two, range(30, 31), FAST_BF16)
    assert "x2 (was cpu (SKU NVIDIA A100" in two.state_dict()["probe"]["trigger"]


def test_an_old_state_without_evidence_loads_and_probes() -> None:
    ap = AutoPrecision("auto", CPU)
    drive(ap, range(1, 30), FAST_BF16)
    old = {
        k: v
        for k, v in ap.state_dict().items()
        if k in ("policy", "reduced", "current", "last_step", "cooldown_until")
        or k in ("overflows_in_row", "losses", "switches", "skips", "scaler")
    }
    old["format"] = 2
    again = AutoPrecision("auto", CPU)
    again.load_state_dict(old)
    drive(again, range(30, 31), FAST_BF16)
    assert again.state_dict()["probe"]["trigger"] == NO_EVIDENCE


def test_load_state_dict_rejects_mismatch_before_change() -> None:
    ap = AutoPrecision("auto", CPU)
    with pytest.raises(ValueError, match="policy 'bf16' differs"):
        ap.load_state_dict(AutoPrecision("bf16", CPU).state_dict())
    fp16 = AutoPrecision("fp16", CPU)
    state = fp16.state_dict()
    with pytest.raises(ValueError, match="format"):
        fp16.load_state_dict({**state, "format": 99})
    with pytest.raises(ValueError, match="reduced dtype bf16 differs from fp16"):
        fp16.load_state_dict({**state, "reduced": "bf16"})
    assert ap.state_dict()["current"] == "fp32" and fp16.current == "fp16"


def test_bad_config_and_input_are_refused_by_name() -> None:
    for kwargs, name in [
        ({"overflow_streak": 0}, "overflow_streak"),
        ({"spike_factor": 1.0}, "spike_factor"),
        ({"utilization_delta": 0.0}, "utilization_delta"),
        ({"min_dwell_s": -1}, "min_dwell_s"),
        ({"world_size": 0}, "world_size"),
    ]:
        with pytest.raises(ValueError, match=name):
            AutoPrecision("auto", CPU, **kwargs)  # type: ignore[arg-type]
    ap = AutoPrecision("auto", CPU)
    with pytest.raises(ValueError, match="percent"):
        ap.observe(1, 75.0, 1.0, False)
    with pytest.raises(ValueError, match="step_time_s"):
        ap.observe(1, 0.5, 1.0, False, step_time_s=-1.0)
    assert ap.state_dict()["last_step"] is None and ap.state_dict()["train_s"] == 0.0
    ap.observe(3, 0.5, 1.0, False)
    with pytest.raises(ValueError, match="not after"):
        ap.observe(3, 0.5, 1.0, False)


# --- a real (tiny) model under the policy ------------------------------------------------


def test_a_tiny_model_trains_in_the_dtype_each_probe_block_names() -> None:
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    ap = AutoPrecision("auto", CPU)
    losses, dtypes = [], []
    for step in range(1, 31):
        opt.zero_grad()
        with ap.autocast():
            out = model(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
        dtypes.append(out.dtype)
        ap.scale(loss).backward()
        ap.step(opt)
        overflowed = ap.update()
        losses.append(loss.item())
        ap.observe(step, None, loss.item(), overflowed, step_time_s=FAST_BF16[ap.current_dtype])
    assert dtypes[:8] == [FP32] * 8 and dtypes[8:13] == [BF16] * 5 and dtypes[23:] == [BF16] * 7
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
