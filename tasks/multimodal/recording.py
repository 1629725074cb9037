"""What a multi-modal run puts in MLflow, and the comparison of layouts.

Per run: the spec as params, the layout and each rank's role as tags, the loss and
samples/s per step (rank 0 logs them while it trains), then the run's figures: samples/s,
step time, each role's compute per step and memory (``<role>.state_mb``,
``<role>.activation_peak_mb``, ``<role>.peak_rss_mb``, ``<role>.device_peak_mb`` on GPUs),
the largest per-device footprint, and the quality of the trained model beside the same
model untrained (zero-shot accuracy, image→text and text→image recall@1/5, chance
levels), with a bar chart of them. A comparison's parent run holds every layout's figures
and the ratios to the single-device run, so MLflow's compare view shows them side by side.
"""

from __future__ import annotations

import logging
from typing import Any

from gpuflow.tasks.multimodal.spec import MultimodalSpec
from gpuflow.tasks.tracking import log_figure, log_json, log_metrics, log_tags, open_run

log = logging.getLogger(__name__)

EXPERIMENT = "gpuflow-multimodal"
QUALITY_KEYS = ("zero_shot_acc", "i2t_r1", "i2t_r5", "t2i_r1", "t2i_r5")
_MB = 1e6


def open_multimodal_run(
    spec: MultimodalSpec, experiment: str = EXPERIMENT, parent_run_id: str | None = None
) -> str:
    layout = spec.resolved_layout
    return open_run(
        experiment,
        run_name=spec.job_id,
        tags={
            "gpuflow.job_id": spec.job_id,
            "gpuflow.layout": layout.name,
            "gpuflow.roles": ",".join(map(layout.role_name, range(layout.world_size))),
        },
        params={**spec.model_dump(), "world_size": layout.world_size},
        parent_run_id=parent_run_id,
    )


def metric_role(role: str) -> str:
    return role.replace("+", "_")  # MLflow's metric names allow no '+'


def run_figures(ranks: dict[int, dict[str, Any]]) -> dict[str, float]:
    """The run's throughput, time and memory figures from its ranks' results."""
    first = ranks[0]
    figures: dict[str, float] = {
        "samples_per_s": first["samples_per_s"],
        "step_time_s": first["step_time_s"],
        "final_loss": first["final_loss"],
        "world_size": float(len(ranks)),
    }
    footprints = []
    for result in ranks.values():
        role, memory = metric_role(result["role"]), result["memory"]
        figures[f"{role}.compute_s_per_step"] = result["compute_s_per_step"]
        for key in ("state_bytes", "activation_peak_bytes", "peak_rss_bytes", "device_peak_bytes"):
            if key in memory:
                figures[f"{role}.{key.removesuffix('_bytes')}_mb"] = memory[key] / _MB
        footprints.append(
            memory.get("device_peak_bytes", memory["state_bytes"] + memory["activation_peak_bytes"])
        )
    figures["max_device_memory_mb"] = max(footprints) / _MB
    return figures


def quality_figures(trained: dict[str, float], untrained: dict[str, float]) -> dict[str, float]:
    out = {k: v for k, v in trained.items()}
    out.update({f"untrained.{k}": untrained[k] for k in QUALITY_KEYS})
    return out


def quality_plot(trained: dict[str, float], untrained: dict[str, float]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = range(len(QUALITY_KEYS))
    width = 0.28
    ax.bar([i - width for i in x], [untrained[k] for k in QUALITY_KEYS], width, label="untrained")
    ax.bar(list(x), [trained[k] for k in QUALITY_KEYS], width, label="trained")
    chance = [
        trained.get(f"{k}_chance", 0.1 if k == "zero_shot_acc" else 0.0) for k in QUALITY_KEYS
    ]
    ax.bar([i + width for i in x], chance, width, label="chance")
    ax.set_xticks(list(x), QUALITY_KEYS)
    ax.set_ylim(0, 1)
    ax.set_ylabel("held-out split")
    ax.legend()
    fig.tight_layout()
    return fig


def record_multimodal_results(
    run_id: str,
    ranks: dict[int, dict[str, Any]],
    trained: dict[str, float],
    untrained: dict[str, float],
) -> dict[str, float]:
    figures = run_figures(ranks) | quality_figures(trained, untrained)
    log_metrics(run_id, figures)
    log_tags(
        run_id,
        {"gpuflow.resource_ids": ",".join(str(ranks[r]["resource_id"]) for r in sorted(ranks))},
    )
    log_json(
        run_id,
        {str(r): {k: v for k, v in res.items() if k != "losses"} for r, res in ranks.items()},
        "ranks.json",
    )
    log_figure(run_id, quality_plot(trained, untrained), "quality.png")
    log.info(
        "%s ranks: %s samples/s, zero-shot %.3f (untrained %.3f), i2t R@1 %.3f (untrained %.3f)",
        len(ranks),
        "-" if figures["samples_per_s"] is None else f"{figures['samples_per_s']:.1f}",
        trained["zero_shot_acc"],
        untrained["zero_shot_acc"],
        trained["i2t_r1"],
        untrained["i2t_r1"],
    )
    return figures


def comparison_rows(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per layout, with its ratio to the single-device run where there is one."""
    base = results.get("single")
    rows = []
    for layout, result in results.items():
        f = result["figures"]
        row = {
            "layout": layout,
            "ranks": int(f["world_size"]),
            "samples_per_s": f["samples_per_s"],
            "max_device_memory_mb": f["max_device_memory_mb"],
            **{k: f[k] for k in QUALITY_KEYS},
        }
        if base is not None and f["samples_per_s"] and base["figures"]["samples_per_s"]:
            row["speedup"] = f["samples_per_s"] / base["figures"]["samples_per_s"]
        rows.append(row)
    return rows


def record_comparison(parent_run_id: str, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        layout = row["layout"]
        log_metrics(
            parent_run_id,
            {f"{layout}.{k}": v for k, v in row.items() if isinstance(v, int | float)},
        )
    log_json(parent_run_id, rows, "comparison.json")
