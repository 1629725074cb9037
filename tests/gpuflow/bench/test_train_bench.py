"""`gpuflow bench train` section (b): the arms interleaved, paired by seed, set against noise.

Behaviour only: which runs happen in which order and how they are summarised. No timing is
asserted (speed lives in the benchmark's figures, docs/benchmarks.md).
"""

from __future__ import annotations

import math

import pytest
import torch

from gpuflow.bench.precision_compare import describe, precision_comparison, summarize
from gpuflow.bench.reference_block import PlainBlockLM, ReferenceConfig, train_reference

TINY_REF = ReferenceConfig(dim=32, n_heads=2, n_layers=1, seq_len=16, batch_size=2, eval_batches=1)


def _run(policy: str, seed: int, train: float, wall: float, loss: float) -> dict[str, object]:
    return {
        "policy": policy,
        "seed": seed,
        "train_time_s": train,
        "wall_time_s": wall,
        "eval_loss": loss,
        "step_times_s": [train / 10] * 10,
    }


def test_describe_gives_mean_std_and_a_t_interval() -> None:
    d = describe([1.0, 2.0, 3.0])
    assert d["mean"] == 2.0 and d["std"] == 1.0
    # t(0.975, 2 dof) = 4.303: half width 4.303 / sqrt(3).
    assert d["ci95_high"] - 2.0 == pytest.approx(4.3027 / math.sqrt(3), rel=1e-3)
    assert math.isnan(describe([1.0])["std"])


def test_summary_pairs_by_seed_and_sets_the_delta_against_fp32_spread() -> None:
    runs = [
        _run("fp32", 0, 10.0, 12.0, 2.00),
        _run("fp32", 1, 12.0, 14.0, 2.02),
        _run("fp32", 2, 11.0, 13.0, 2.04),
        # bf16 twice as fast in steps, loss within noise; "slow" differs by 10 fp32 std.
        _run("bf16", 0, 5.0, 7.0, 2.001),
        _run("bf16", 1, 6.0, 8.0, 2.021),
        _run("bf16", 2, 5.5, 7.5, 2.041),
        _run("slow", 0, 20.0, 22.0, 2.20),
        _run("slow", 1, 24.0, 26.0, 2.22),
        _run("slow", 2, 22.0, 24.0, 2.24),
    ]
    out = summarize(runs, ["fp32", "bf16", "slow"])
    assert out["seeds"] == 3
    assert out["fp32_eval_mean"] == pytest.approx(2.02)
    assert out["fp32_eval_std"] == pytest.approx(0.02)
    assert out["step_speedup_bf16"] == pytest.approx(2.0)
    assert out["step_speedup_bf16_std"] == pytest.approx(0.0, abs=1e-12)
    assert out["median_step_speedup_bf16"] == pytest.approx(2.0)
    assert out["wall_speedup_bf16"] == pytest.approx((12 / 7 + 14 / 8 + 13 / 7.5) / 3)
    assert out["delta_bf16_within_3std"] is True
    assert out["eval_delta_bf16"] == pytest.approx(0.001)
    assert out["step_speedup_slow"] == pytest.approx(0.5)
    assert out["delta_slow_within_3std"] is False
    assert out["delta_slow_in_fp32_std"] == pytest.approx(10.0)
    assert out["convergence_delta_slow"] == pytest.approx(0.2 / 2.02)


def test_plain_block_is_the_design_shape_and_causal() -> None:
    cfg = ReferenceConfig()
    assert (cfg.dim, cfg.n_heads, cfg.n_layers, cfg.seq_len, cfg.batch_size, cfg.lr) == (
        256,
        4,
        4,
        128,
        16,
        3e-4,
    )
    model = PlainBlockLM(TINY_REF).eval()
    layer = model.layers[0]
    assert layer.norm_first and isinstance(layer.norm1, torch.nn.LayerNorm)
    tokens = torch.randint(0, 256, (2, 16))
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 256
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_reference_arm_is_seeded_and_refuses_other_policies() -> None:
    a = train_reference("fp32", steps=2, seed=3, config=TINY_REF)
    b = train_reference("fp32", steps=2, seed=3, config=TINY_REF)
    assert a["eval_loss"] == b["eval_loss"] and len(a["step_times_s"]) == 2
    with pytest.raises(ValueError, match="fp32 or bf16"):
        train_reference("fp16", steps=1, seed=0)


def test_comparison_interleaves_every_arm_per_seed(tmp_path) -> None:
    seen: list[str] = []
    lm, ref, raw = precision_comparison(
        2,
        tmp_path,
        seeds=(0, 1, 2),
        model="llama-tiny",
        reference_steps=2,
        reference=TINY_REF,
        report=seen.append,
    )
    policies = {r["policy"] for r in raw if r["arm"] == "lm"}
    arms_per_round = len(policies) + len({r["policy"] for r in raw if r["arm"] == "ref"})
    assert len(raw) == 3 * arms_per_round
    rounds = [raw[i * arms_per_round : (i + 1) * arms_per_round] for i in range(3)]
    for seed, rnd in enumerate(rounds):
        assert {r["seed"] for r in rnd} == {seed}  # one seed per round, every arm in it
    # The order rotates: each round starts with a different arm.
    firsts = [(r[0]["arm"], r[0]["policy"]) for r in rounds]
    assert len(set(firsts)) == 3
    assert {"fp32", "auto"} <= policies
    assert lm["seeds"] == ref["seeds"] == 3
    for arm in policies - {"fp32"}:
        assert math.isfinite(lm[f"step_speedup_{arm}"]) and math.isfinite(lm[f"wall_speedup_{arm}"])
        assert isinstance(lm[f"delta_{arm}_within_3std"], bool)
    assert lm["auto_vs_best_fixed"] > 0 and len(lm["auto_switches"]) == 3
    assert len(seen) == len(raw)


def test_comparison_needs_a_spread(tmp_path) -> None:
    with pytest.raises(ValueError, match="two seeds"):
        precision_comparison(2, tmp_path, seeds=(0,))
