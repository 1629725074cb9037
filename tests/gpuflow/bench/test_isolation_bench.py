"""The isolation bench's verdict follows the sweep it is given and the closed form."""

from __future__ import annotations

from gpuflow.tasks.health.isolation_study import (
    LLAMA3_SOFTWARE_RATIO,
    IsolationConfig,
    contained_share,
    sweep,
)

from gpuflow.bench.isolation_bench import verdict


def test_the_verdict_names_who_reaches_the_claim_and_what_it_takes():
    cfg = IsolationConfig(n_gpus=32, horizon_days=120.0)
    table = sweep(cfg, seeds=2, tenants=(2, 7), ratios=(LLAMA3_SOFTWARE_RATIO, 16.0))
    out = verdict(table, contained_share(cfg), claim=0.82)
    assert "unreachable (interruptions)" in out["N=2"] and "unreachable" in out["N=5"]
    assert "unreachable" not in out["N=6"].split(";")[1].split("(interruptions)")[0]
    reached = {p for p, row in table.items() if row["reduction"] >= 0.82}
    assert reached and all(n == 7 for n, _ in reached)  # 2 tenants never: ceiling 50 %
    assert out["swept points reaching it"] == ", ".join(f"N={n} r={r:.3g}" for n, r in reached)
    assert ">= 6 tenants per GPU" in out["verdict"]
    # A claim no tenant count can reach is said so.
    assert "out of reach for every tenant count" in verdict(table, 0.0, claim=0.9)["verdict"]
