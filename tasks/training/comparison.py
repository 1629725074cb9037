"""Speedup and convergence delta of candidate precision policies against fp32."""

from __future__ import annotations

from typing import Any


def compare_results(results: dict[str, dict[str, Any]], threshold: float) -> list[dict[str, Any]]:
    """One row per candidate: speedup (baseline wall / candidate wall), convergence delta
    (|candidate eval loss - baseline| / baseline), and a verdict against ``threshold``."""
    if threshold <= 0:
        raise ValueError(f"threshold must be > 0, got {threshold}")
    base = results.get("fp32")
    if base is None:
        raise ValueError("the comparison needs the fp32 baseline")
    if not base.get("eval_loss"):
        raise ValueError("the fp32 baseline has no eval loss (was it stopped early?)")
    where = base.get("placement")
    moved = [p for p, r in results.items() if r.get("placement", where) != where]
    if moved:
        # A ratio between two devices measures the devices, not the precision.
        raise ValueError(
            f"candidates {moved} ran elsewhere than the fp32 baseline ({where}); "
            "every arm must run on the baseline's units"
        )
    rows = []
    for policy, res in results.items():
        if policy == "fp32":
            continue
        if res.get("eval_loss") is None:
            raise ValueError(f"candidate {policy} has no eval loss (was it stopped early?)")
        speedup = base["wall_time_s"] / res["wall_time_s"]
        delta = abs(res["eval_loss"] - base["eval_loss"]) / base["eval_loss"]
        rows.append(
            {
                "policy": policy,
                "speedup": speedup,
                "step_speedup": base["train_time_s"] / res["train_time_s"],
                "convergence_delta": delta,
                "baseline_eval_loss": base["eval_loss"],
                "eval_loss": res["eval_loss"],
                "switches": len(res.get("switches", [])),
                "verdict": "pass" if delta < threshold else "fail",
            }
        )
    return rows
