"""The health bench's sweep: the diagonal feeds the crossover, the off-diagonal settings are
reported beside it with the champion each seed's validation chose, the production fleet at
its real fault rate is judged move-only and under each cordon setting, and a fleet too
small to fail in a split still runs."""

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
        cordon=("24 h hold, free",),
        lstm_small=True,
        off_diagonal=("benign remaps only",),
        real_seeds=(1,),
        # HistoryConfig()'s fault rate (not small()'s raised one) on a tiny fleet and sample
        real_size={
            "nodes": 64,
            "days": 60.0,
            "background_segments": (30, 15, 30),
            "background_segment_s": (7200.0, 14400.0, 43200.0),
            "noise_segments": (12, 6, 12),
        },
    )
    out = run_uncertainty(True, lambda _: None, plan)
    raw = out["figures"][0]
    assert set(raw) == {
        "main",
        "sweep default",
        "sweep very noisy",
        "off diagonal benign remaps only",
        "cordon 24 h hold, free",
        "real rate move only",
        "real rate 24 h hold, free",
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
    # The real fault rate: the same models re-judged move-only and under the plan's cordon,
    # each section naming its fleet and the champion validation chose.
    real = [k for k in out if k.startswith("real fault rate: ")]
    assert [k.split(" (")[0] for k in real] == [
        "real fault rate: move only",
        "real fault rate: 24 h hold, free",
    ]
    assert all("64 nodes x 60 days" in k for k in real)
    assert out[real[0]]["champion on validation, by seed"] in {"rules", "gbt", "lstm"}
    assert raw["real rate move only"]["table"].keys() == raw["main"].keys()
    assert Plan.of(quick=False).real_seeds == (1, 2, 3)
    assert Plan.of(quick=True).real_seeds == ()
