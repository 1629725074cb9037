"""The health bench's sweep: the diagonal feeds the crossover, the off-diagonal settings are
reported beside it with the champion each seed's validation chose, and a fleet too small
to fail in a split still runs."""

from __future__ import annotations

from gpuflow.bench.health_bench import OFF_DIAGONAL, Plan, run_uncertainty


def test_off_diagonal_settings_are_reported_but_not_read_as_a_crossover() -> None:
    # 16 nodes x 20 days: a fleet whose splits can hold no failure at all (it used to stop
    # in carve_calibration on an empty failure list).
    plan = Plan(
        size={"nodes": 16, "days": 20.0},
        main_seeds=(1,),
        sweep_seeds=(1,),
        settings=("default", "very noisy"),
        resamples=20,
        gbt_max_iter=5,
        cordon=(),
        lstm_small=True,
        off_diagonal=("benign remaps only",),
    )
    out = run_uncertainty(True, lambda _: None, plan)
    raw = out["figures"][0]
    assert set(raw) == {
        "main",
        "sweep default",
        "sweep very noisy",
        "off diagonal benign remaps only",
    }
    assert raw["off diagonal benign remaps only"]["knobs"] == (
        "hbm_silent_share 0, benign_remap_per_day 0.03"
    )
    off = [k for k in out if k.startswith("off the diagonal: benign remaps only")]
    assert len(off) == 1
    champion = out[off[0]]["champion on validation, by seed"]
    assert champion in {"rules", "gbt", "lstm"}
    assert "gbt - rules: net GPU-h saved / 1000 dd" in out[off[0]]
    # The crossover reads the diagonal only, quiet -> noisy, in the sweep's order.
    finding = out["noise sweep: finding"]["crossover"]
    assert "default" in finding and "very noisy" in finding
    assert "benign remaps only" not in finding
    assert [n for n, *_ in OFF_DIAGONAL] == list(Plan.of(quick=False).off_diagonal)
    assert Plan.of(quick=True).off_diagonal == ()
