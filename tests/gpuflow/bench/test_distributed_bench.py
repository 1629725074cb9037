"""`gpuflow bench distributed`'s pure parts: the mixed-generation figure from the SKU tables
and how the runs' results become its figures. The gang launches themselves (about 30 s
each on the 2-core VM) run in the benchmark, not here; tests/tasks/training/distributed/
test_launch.py covers the gang's behaviour."""

from __future__ import annotations

import pytest
from gpuflow.hardware.skus import SKUS
from gpuflow.tasks.scheduling.trace import A100_40, V100

from gpuflow.bench.allreduce_probe import probe_allreduce, probe_summary
from gpuflow.bench.distributed_bench import (
    GOAL_STALL_RATIO,
    bench_spec,
    checkpoint_stall,
    correctness,
    cost,
    gang_stalls,
    goals,
    max_abs_difference,
    mixed_generations,
)


def _rank(stalls: list[float], **kw) -> dict:
    return {"checkpoint_stalls_s": stalls, **kw}


def test_a_mixed_gang_runs_at_the_v100s_pace_on_every_rank() -> None:
    out = mixed_generations()
    a, v = SKUS[A100_40], SKUS[V100]
    # 8 x min(rate) against 8 x the A100's rate.
    assert out["fp32_throughput_vs_8xa100"] == pytest.approx(v.fp32_tflops / a.fp32_tflops, 1e-3)
    assert out["fp16_throughput_vs_8xa100"] == pytest.approx(
        v.reduced_tflops / a.reduced_tflops, 1e-3
    )
    assert out["fp32_change_vs_8xa100"] == pytest.approx(out["fp32_throughput_vs_8xa100"] - 1)
    assert out["fp16_change_vs_8xa100"] < out["fp32_change_vs_8xa100"] < 0
    assert out["seed_claim_change"] == -0.37
    assert "SKU tables" in out["kind"]


def test_correctness_compares_the_loss_curves_step_by_step() -> None:
    single = {"steps_done": 3, "final_loss": 2.0}
    gang = {"losses": [3.0, 2.5, 2.0001], "final_loss": 2.0001}
    out = correctness(single, [3.0, 2.4, 2.0], gang, weights_diff=1e-7)
    assert out["loss_max_abs_diff"] == pytest.approx(0.1)
    assert out["final_weights_max_abs_diff"] == 1e-7 and out["steps"] == 3


def test_loss_curves_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="3 vs 2 steps"):
        max_abs_difference([1.0, 2.0, 3.0], [1.0, 2.0])


def test_cost_is_time_inside_steps_per_step() -> None:
    single = {"train_time_s": 10.0, "steps_done": 50}
    gang = {"train_time_s": 6.0, "steps_done": 50, "world_size": 2}
    probe = probe_summary(
        [
            {"synced": 0.10, "no_sync": 0.08, "bare": 0.01, "grad_mb": 12.5},
            {"synced": 0.11, "no_sync": 0.07, "bare": 0.02, "grad_mb": 12.5},
        ],
        steps=20,
    )
    out = cost(single, gang, probe)
    assert out["single_step_s"] == pytest.approx(0.2) and out["gang_step_s"] == pytest.approx(0.12)
    assert out["gang_vs_single_step"] == pytest.approx(0.6)
    assert out["ideal_gang_vs_single_step"] == 0.5
    # The slowest rank's medians: 0.11 synced, 0.08 without the all-reduce.
    assert out["ddp_allreduce_exposed_s"] == pytest.approx(0.03)
    assert out["allreduce_share_of_ddp_step"] == pytest.approx(0.03 / 0.11)
    assert out["allreduce_share_of_gang_step"] == pytest.approx(0.03 / 0.12)
    assert out["bare_allreduce_s"] == pytest.approx(0.02)


def test_an_all_reduce_never_shows_as_a_negative_cost() -> None:
    rows = [{"synced": 0.10, "no_sync": 0.12, "bare": 0.01, "grad_mb": 1.0}]
    assert probe_summary(rows, steps=5)["ddp_allreduce_exposed_s"] == 0.0


def test_the_probe_refuses_a_gang_it_cannot_measure_before_starting_ranks(tmp_path) -> None:
    spec = bench_spec("llama-tiny", 10, 5)
    with pytest.raises(ValueError, match=">= 2 ranks"):
        probe_allreduce(spec, 1, 5, tmp_path / "p")
    with pytest.raises(ValueError, match="does not split into 5 ranks"):
        probe_allreduce(spec, 5, 5, tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_a_gangs_stall_per_save_is_its_slowest_ranks() -> None:
    assert gang_stalls([_rank([0.1, 0.5]), _rank([0.3, 0.4])]) == [0.3, 0.5]
    with pytest.raises(ValueError):  # ranks that saved a different number of times
        gang_stalls([_rank([0.1, 0.5]), _rank([0.3])])


def test_checkpoint_figures_split_async_from_sync_saves_and_compare_resumes() -> None:
    # Periodic saves async (0.01, 0.03, 0.02), the last sync (0.4); each 2-rank resume's
    # only save is sync (0.2, 0.3). Resume times: medians over the repeats.
    gang = {"ranks": [_rank([0.01, 0.03, 0.02, 0.4])], "to_first_step_s": 1.0}
    resumed = {
        2: [
            {"ranks": [_rank([0.2])], "to_first_step_s": 1.5},
            {"ranks": [_rank([0.3])], "to_first_step_s": 1.5},
        ],
        1: [{"ranks": [], "to_first_step_s": t} for t in (0.5, 1.0)],
        3: [{"ranks": [], "to_first_step_s": t} for t in (2.0, 4.0)],
    }
    out = checkpoint_stall(gang, resumed)
    assert (out["async_saves"], out["sync_saves"]) == (3, 3)
    assert out["async_stall_median_s"] == pytest.approx(0.02)
    assert out["sync_stall_median_s"] == pytest.approx(0.3)
    assert out["stall_ratio"] == pytest.approx(0.02 / 0.3)
    assert out["resume_repeats"] == 2
    assert out["meets_goal"] is True and out["goal_ratio"] == GOAL_STALL_RATIO
    assert out["resume_2_on_1_vs_on_2"] == pytest.approx(0.5)
    assert out["resume_2_on_3_vs_on_2"] == pytest.approx(2.0)
    assert out["restore_on_2_s"] == pytest.approx(0.5)


def test_a_run_without_an_async_checkpoint_is_refused() -> None:
    gang = {"ranks": [_rank([0.4])], "to_first_step_s": 1.0}
    with pytest.raises(ValueError, match="no periodic"):
        checkpoint_stall(gang, {2: [{"ranks": [_rank([0.2])], "to_first_step_s": 1.0}]})


def test_goals_gather_the_headline_figures() -> None:
    out = {
        "correctness": {"loss_max_abs_diff": 1e-6, "final_weights_max_abs_diff": 2e-6},
        "cost": {"gang_vs_single_step": 0.7, "allreduce_share_of_gang_step": 0.2},
        "checkpoint": {"stall_ratio": 0.3, "meets_goal": False},
        "mixed_generations": mixed_generations(),
    }
    got = goals(out)
    assert got["stall_ratio"] == 0.3 and got["stall_goal_met"] is False
    assert got["gang_vs_single_step"] == 0.7 and got["loss_max_abs_diff"] == 1e-6
    assert got["mixed_fp32_change_vs_8xa100"] == out["mixed_generations"]["fp32_change_vs_8xa100"]
