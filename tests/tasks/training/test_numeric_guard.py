"""The numeric guard before the optimizer step (tasks/training/guard.py, in the loop).

Asserted: a poisoned batch (its forward overflows to inf, so the loss is NaN) under bf16
and under fp16 leaves the weights finite and bit-equal to a run that never saw that
batch (same data otherwise, same precision schedule); the skip is in the policy's log,
the step's StepInfo and the result; the policy is in fp32 for its cooldown afterwards. A
GradScaler overflow of the gradients alone stays the scaler's (no skip, no fallback, the
scale backs off once as GradScaler's own). Without the guard the same batch makes the
weights NaN and the checkpoint of them is refused, the good one kept. Clipping clips;
a bad ``grad_clip_norm`` is refused by name. Two gloo ranks of which only rank 0 sees a
non-finite loss both skip and stay equal.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from gpuflow.tasks.training import loop, precision
from gpuflow.tasks.training.autoprecision import AutoPrecision
from gpuflow.tasks.training.checkpoint import CheckpointManager
from gpuflow.tasks.training.guard import (
    NonFiniteWeightsError,
    Verdict,
    judge,
    total_grad_norm,
)
from gpuflow.tasks.training.spec import TrainSpec
from gpuflow.tasks.training.storage import LocalStorage
from pydantic import ValidationError

POISON_AT = 4  # the training forward (= step) whose output overflows
_BUILD = loop.build_workload  # the real one (tests wrap it through monkeypatch)


@pytest.fixture(autouse=True)
def _cpu_bf16(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # bf16 must be available whatever this CPU's flags (as test_precision.py does).
    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags : avx512f avx512_bf16\n")
    monkeypatch.setattr(precision, "CPUINFO_PATH", info)


def _spec(job: str, steps: int, policy: str, **fields: Any) -> TrainSpec:
    base: dict[str, Any] = {
        "job_id": job,
        "model": "llama-tiny",
        "steps": steps,
        "precision": policy,
        "checkpoint_interval": 100,
        "batch_size": 4,
        "seq_len": 16,
        "eval_batches": 1,
    }
    return TrainSpec(**{**base, **fields})


class _Dropping:
    """The sampler, minus its ``drop``-th batch (the loop only calls next and the state)."""

    def __init__(self, inner: Any, drop: int) -> None:
        self.inner, self.drop, self.calls = inner, drop, 0

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        self.calls += 1
        if self.calls == self.drop:
            next(self.inner)
        return next(self.inner)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


def _poison_forward(model: torch.nn.Module, at: int) -> None:
    """The ``at``-th training forward returns inf logits (an overflowing activation)."""
    seen = [0]

    def hook(module: torch.nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor | None:
        if not module.training:
            return None  # eval forwards do not count
        seen[0] += 1
        return out * math.inf if seen[0] == at else None

    model.register_forward_hook(hook)


def _run(
    monkeypatch: pytest.MonkeyPatch,
    spec: TrainSpec,
    root: Path,
    *,
    poison_at: int | None = None,
    drop_at: int | None = None,
    fall_back_at: int | None = None,
    infos: list[loop.StepInfo] | None = None,
) -> tuple[loop.TrainResult, loop.Workload]:
    built: list[loop.Workload] = []

    def build(
        spec: TrainSpec, device: torch.device, sku: Any = None, world_size: int = 1
    ) -> loop.Workload:
        w = _BUILD(spec, device, sku, world_size)
        if poison_at is not None:
            _poison_forward(w.model, poison_at)
        if drop_at is not None:
            w.sampler = _Dropping(w.sampler, drop_at)
        if fall_back_at is not None:
            # The reference's precision schedule: the fp32 fallback the poisoned run takes
            # at its skipped step, taken here after the step before the dropped batch.
            observe = w.precision.observe

            def observed(step: int, *args: Any, **kwargs: Any) -> Any:
                if step == fall_back_at:
                    kwargs["skipped"] = "reference schedule"
                return observe(step, *args, **kwargs)

            w.precision.observe = observed  # type: ignore[method-assign]
        built.append(w)
        return w

    monkeypatch.setattr(loop, "build_workload", build)
    hooks = [infos.append] if infos is not None else []
    result = loop.train_loop(spec, LocalStorage(root), hooks=hooks)
    return result, built[0]


def _assert_bit_equal(a: dict[str, Any], b: dict[str, Any], what: str) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), f"{what}: {k} differs"
        elif isinstance(a[k], dict):
            _assert_bit_equal(a[k], b[k], f"{what}.{k}")
        else:
            assert a[k] == b[k], f"{what}: {k} differs"


@pytest.mark.parametrize("policy", ["bf16", "fp16"])
def test_a_poisoned_batch_is_skipped_and_the_run_equals_one_without_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, policy: str
) -> None:
    torch.set_num_threads(1)
    steps = 8
    infos: list[loop.StepInfo] = []
    poisoned, pw = _run(
        monkeypatch,
        _spec("poisoned", steps, policy),
        tmp_path / "p",
        poison_at=POISON_AT,
        infos=infos,
    )
    # The reference never sees batch POISON_AT: one step fewer over the same other batches.
    reference, rw = _run(
        monkeypatch,
        _spec("reference", steps - 1, policy),
        tmp_path / "r",
        drop_at=POISON_AT,
        fall_back_at=POISON_AT - 1,
    )

    assert all(bool(torch.isfinite(p).all()) for p in pw.model.parameters())
    _assert_bit_equal(pw.model.state_dict(), rw.model.state_dict(), "model")
    _assert_bit_equal(
        pw.optimizer.state_dict()["state"], rw.optimizer.state_dict()["state"], "optimizer"
    )
    assert math.isfinite(poisoned.final_loss) and poisoned.final_loss == reference.final_loss

    # The skip is logged: in the policy, in the step's StepInfo, in the result.
    assert [(s.step, s.precision) for s in pw.precision.skips] == [(POISON_AT, policy)]
    assert "non-finite loss" in pw.precision.skips[0].reason
    assert poisoned.skips == [s.to_dict() for s in pw.precision.skips]
    skipped = [i for i in infos if i.skipped is not None]
    assert [i.step for i in skipped] == [POISON_AT] and not math.isfinite(skipped[0].loss)
    assert all(math.isfinite(i.grad_norm) for i in infos if i.skipped is None)  # type: ignore[arg-type]

    # ... and fp32 for the cooldown: the switch names the skip, the policy is in fp32 now.
    switch = poisoned.switches[-1]
    assert (switch.step, switch.to_dtype) == (POISON_AT, torch.float32)
    assert "step skipped" in switch.reason
    assert pw.precision.current == "fp32" and pw.precision.in_cooldown(steps)
    assert [i.precision for i in infos[POISON_AT:]] == ["fp32"] * (steps - POISON_AT)

    # The checkpoint holds the skip, so a resume knows it.
    state = CheckpointManager(LocalStorage(tmp_path / "p"), "poisoned").latest().state
    assert state["precision"]["skips"] == poisoned.skips


def test_a_scaler_overflow_of_the_gradients_stays_the_scalers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Finite loss, inf gradients, fp16: the GradScaler skips and backs off, as alone;
    the guard neither falls back nor logs a skip (no double handling)."""
    torch.set_num_threads(1)
    infos: list[loop.StepInfo] = []
    built: list[loop.Workload] = []
    after: list[tuple[float, torch.Tensor]] = []  # (scale, first parameter) after each step

    def build(
        spec: TrainSpec, device: torch.device, sku: Any = None, world_size: int = 1
    ) -> loop.Workload:
        w = _BUILD(spec, device, sku, world_size)
        # The third step's gradients overflow; its loss stays finite.
        next(w.model.parameters()).register_hook(
            lambda g: g * math.inf if len(infos) == 2 else None
        )
        built.append(w)
        return w

    def record(info: loop.StepInfo) -> None:
        w = built[0]
        after.append((w.precision.scaler.get_scale(), next(w.model.parameters()).detach().clone()))  # type: ignore[union-attr]
        infos.append(info)

    monkeypatch.setattr(loop, "build_workload", build)
    result = loop.train_loop(_spec("overflow", 5, "fp16"), LocalStorage(tmp_path), hooks=[record])

    third = infos[2]
    assert third.skipped is None and math.isfinite(third.loss)
    assert not math.isfinite(third.grad_norm)  # type: ignore[arg-type]
    assert result.skips == [] and [i.precision for i in infos] == ["fp16"] * 5
    assert result.switches == []  # no fallback
    # The scaler skipped that step and backed off once, exactly as GradScaler alone does.
    assert torch.equal(after[2][1], after[1][1])
    assert after[2][0] == after[1][0] * 0.5
    # Every step: the scale backs off exactly when the scaler's own check overflowed.
    initial = 65536.0  # GradScaler's default init_scale
    for (scale, _), prev, info in zip(
        after, [initial] + [a[0] for a in after], infos, strict=False
    ):
        overflow = not math.isfinite(info.grad_norm)  # type: ignore[arg-type]
        assert scale == (prev * 0.5 if overflow else prev), info.step


def test_judge_leaves_scaled_overflows_of_the_gradients_to_the_scaler() -> None:
    assert judge(1.0, 2.0, scaled=False) == Verdict(grad_norm=2.0, reason=None)
    assert "non-finite loss" in (judge(math.nan, 2.0, scaled=True).reason or "")
    assert "gradient norm" in (judge(1.0, math.inf, scaled=False).reason or "")
    assert not judge(1.0, math.inf, scaled=True).skip  # the scaler's overflow


def test_without_the_guard_the_weights_go_nan_and_their_checkpoint_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The issue's finding, and the last line of defence: keep_last=1 keeps step 2."""
    torch.set_num_threads(1)
    monkeypatch.setattr(
        loop, "judge", lambda loss, norm, **kw: Verdict(grad_norm=norm, reason=None)
    )
    spec = _spec("unguarded", 6, "bf16", checkpoint_interval=2, keep_last=1)
    with pytest.raises(NonFiniteWeightsError, match=r"step 4 refused.*inf/NaN"):
        _run(monkeypatch, spec, tmp_path, poison_at=3)
    kept = CheckpointManager(LocalStorage(tmp_path), "unguarded").latest()
    assert kept is not None and kept.step == 2
    assert all(bool(torch.isfinite(t).all()) for t in kept.state["model"].values())


def test_checkpoint_manager_refuses_non_finite_weights(tmp_path: Path) -> None:
    manager = CheckpointManager(LocalStorage(tmp_path), "job", keep_last=1)
    manager.save({"model": {"w": torch.ones(3)}}, 1)
    with pytest.raises(NonFiniteWeightsError, match=r"step 2 refused.*: w\b"):
        manager.save({"model": {"w": torch.tensor([1.0, math.nan, 2.0])}}, 2)
    assert [c.checkpoint_id for c in manager.list()] == ["step-000000001"]


def test_clipping_clips_to_the_norm_and_reports_the_norm_before() -> None:
    lin = torch.nn.Linear(4, 3)
    (lin(torch.ones(2, 4)) * 100).sum().backward()
    before = float(
        torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in lin.parameters()]))
    )
    norm = total_grad_norm(lin.parameters(), max_norm=0.5)
    assert norm == pytest.approx(before) and before > 0.5
    after = float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in lin.parameters()])))
    assert after == pytest.approx(0.5, rel=1e-4)
    assert total_grad_norm(lin.parameters()) == pytest.approx(after)  # no clip: untouched


def test_clipping_in_the_spec_reaches_the_step(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    torch.set_num_threads(1)
    _, plain = _run(monkeypatch, _spec("plain", 3, "fp32"), tmp_path / "a")
    _, clipped = _run(monkeypatch, _spec("clipped", 3, "fp32", grad_clip_norm=1e-3), tmp_path / "b")
    a, b = plain.model.state_dict(), clipped.model.state_dict()
    assert any(not torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan])
def test_a_bad_grad_clip_norm_is_refused_by_name(bad: float) -> None:
    with pytest.raises(ValidationError, match=r"grad_clip_norm[\s\S]*positive finite"):
        _spec("bad", 1, "fp32", grad_clip_norm=bad)


def test_skips_survive_a_state_round_trip_and_old_states_load() -> None:
    ap = AutoPrecision("bf16", "cpu", guard_cooldown_steps=5)
    ap.observe(1, None, math.nan, False, skipped="non-finite loss nan")
    state = ap.state_dict()
    other = AutoPrecision("bf16", "cpu", guard_cooldown_steps=5)
    other.load_state_dict(state)
    assert other.skips == ap.skips and other.current == "fp32" and other.in_cooldown(5)
    old = {k: v for k, v in state.items() if k != "skips"} | {"format": 1}
    fresh = AutoPrecision("bf16", "cpu", guard_cooldown_steps=5)
    fresh.load_state_dict(old)  # a checkpoint written before the guard logged skips
    assert fresh.skips == [] and fresh.current == "fp32"


def test_two_ranks_skip_together_when_only_rank_0_sees_a_non_finite_loss(
    tmp_path: Path,
) -> None:
    import multiprocessing
    import pickle

    from tests.tasks.training.guard_gang_rank import POISONED_STEP, guard_rank

    spec = _spec("gang-guard", 5, "fp32", batch_size=4, gpus=2)
    ctx = multiprocessing.get_context("spawn")
    init = tmp_path / "rendezvous"
    procs = [
        ctx.Process(target=guard_rank, args=(rank, 2, str(init), str(tmp_path), spec))
        for rank in range(2)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(180)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    assert [proc.exitcode for proc in procs] == [0, 0]
    ranks = [pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes()) for r in range(2)]
    assert [s["step"] for s in ranks[0]["skips"]] == [POISONED_STEP]
    assert "non-finite loss inf" in ranks[0]["skips"][0]["reason"]
    assert [s["step"] for s in ranks[1]["skips"]] == [POISONED_STEP]
    assert ranks[1]["skips"] == ranks[0]["skips"]  # the same verdict, from the global loss
    assert ranks[0]["finite"] and ranks[1]["finite"]
    _assert_bit_equal(ranks[0]["weights"], ranks[1]["weights"], "rank 0 vs rank 1")
