"""rank_main's ``record`` option: what a rank's result carries for `gpuflow bench
distributed` (rank 0's per-step losses and start-up time, every save's stall)."""

from __future__ import annotations

import time

from gpuflow.tasks.training.distributed.worker import RankRecorder
from gpuflow.tasks.training.loop import StepInfo


class _Checkpointer:
    def __init__(self) -> None:
        self.stalls_s: list[float] = []


class _Parallel:
    def __init__(self) -> None:
        self.built: list[tuple] = []

    def checkpointer(self, *args, **kwargs) -> _Checkpointer:
        self.built.append((args, kwargs))
        return _Checkpointer()


def _info(step: int, loss: float, step_time_s: float) -> StepInfo:
    return StepInfo(step, loss, "fp32", step_time_s, 1.0, None, None, None)


def test_the_recorder_keeps_losses_start_up_and_the_checkpointers_stalls() -> None:
    parallel = _Parallel()
    recorder = RankRecorder(parallel)
    started = time.perf_counter()
    made = parallel.checkpointer("store", "job", keep_last=3)
    assert parallel.built == [(("store", "job"), {"keep_last": 3})]  # still builds as before
    made.stalls_s += [0.25, 0.5]
    recorder.step(_info(1, 3.0, step_time_s=0.0))
    recorder.step(_info(2, 2.5, step_time_s=9.0))
    out = recorder.figures(started)
    assert out["losses"] == [3.0, 2.5]
    assert out["checkpoint_stalls_s"] == [0.25, 0.5]
    assert 0 <= out["to_first_step_s"] <= time.perf_counter() - started


def test_a_rank_that_ran_no_step_reports_no_start_up_time() -> None:
    out = RankRecorder(_Parallel()).figures(time.perf_counter())
    assert out == {"losses": [], "to_first_step_s": None, "checkpoint_stalls_s": []}
