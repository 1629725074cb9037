"""Flow `edge-deploy`: export ─ profile ─ plan cuts ─ package ─ deploy ─ check ─ promote | roll back.

A model is sliced into k shards by measured operator cost, each shard served over the Open
Inference Protocol on one node of an EdgeFleet (local processes on loopback by default),
and the chain's output is checked against the whole model's. Only a chain that passes
becomes the current version (the previous version's processes are stopped then); one that
fails is stopped and the previous version keeps serving. The MLflow run (experiment "edge")
carries the plan, the balance of the DP split and of the equal-operator-count split, the
check, latency and throughput.
"""

from __future__ import annotations

import json
from typing import Literal

import mlflow
from gpuflow.blocks.edge_fleet import EdgeFleet, load_fleet
from gpuflow.tasks.edge.deploy import (
    Deployment,
    EdgeDeployError,
    check_name,
    current_version,
    launch_task,
    new_version,
    set_current,
    stop_task,
)
from gpuflow.tasks.edge.export import export_task
from gpuflow.tasks.edge.nodes import EdgeNode, check_reachable
from gpuflow.tasks.edge.package import package_task
from gpuflow.tasks.edge.planning import PlanResult, plan_task
from gpuflow.tasks.edge.profile import profile_task
from gpuflow.tasks.edge.verify import DEFAULT_ATOL, check_task, local_latency_ms, measure_task
from gpuflow.tasks.tracking import use_experiment
from gpuflow.tasks.training.models.registry import model_spec
from prefect import flow, get_run_logger
from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

EXPERIMENT = "edge"
STEPS = ("export", "profile", "plan", "package", "deploy", "check", "measure")


def preflight(
    model: str, nodes: list[EdgeNode], shards: int | None, mode: str, name: str
) -> list[EdgeNode]:
    """Reject bad input before anything is written or started; the nodes to use."""
    model_spec(model)  # ValueError listing the known models
    if mode not in ("forward", "driver"):
        raise ValueError(f"mode must be 'forward' or 'driver', got {mode!r}")
    k = len(nodes) if shards is None else shards
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"shards must be a positive int, got {shards!r}")
    if k > len(nodes):
        raise ValueError(f"{k} shards need {k} edge nodes but the fleet has {len(nodes)}")
    check_name(name)
    chosen = nodes[:k]
    for node in chosen:
        check_reachable(node)
    return chosen


def _plan_rows(result: PlanResult) -> list[dict]:
    rows = []
    for label, plan in (("dp", result.dp), ("equal-ops", result.equal_ops)):
        tensors = result.cut_tensors(plan) + ["(output)"]
        for shard in plan.shards:
            rows.append(
                {
                    "split": label,
                    "shard": shard.index,
                    "node": shard.node,
                    "segments": f"{shard.first_segment}-{shard.stop_segment - 1}",
                    "ends_at": tensors[shard.index],
                    "compute_ms": round(shard.compute_ms, 3),
                    "transfer_ms": round(shard.transfer_ms, 3),
                    "weights_mb": round(shard.weight_bytes / 1e6, 2),
                }
            )
    return rows


def _stage_figure(result: PlanResult):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    k = len(result.dp.shards)
    width = 0.4
    for offset, (label, plan) in enumerate((("DP", result.dp), ("equal ops", result.equal_ops))):
        xs = [i + (offset - 0.5) * width for i in range(k)]
        ax.bar(
            xs,
            [s.stage_ms for s in plan.shards],
            width,
            label=f"{label} (balance {plan.balance:.2f})",
        )
    ax.axhline(result.dp.ideal_ms, color="k", linestyle="--", linewidth=1, label="ideal")
    ax.set_xlabel("shard")
    ax.set_ylabel("stage time (ms)")
    ax.set_xticks(range(k))
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


@flow(name="edge_deploy", log_prints=True)
def edge_deploy(
    model: str = "resnet18-digits",
    shards: int | None = None,
    fleet_block: str | None = None,
    fleet: EdgeFleet | None = None,
    name: str | None = None,
    mode: Literal["forward", "driver"] = "forward",
    seed: int = 0,
    overrides: dict | None = None,
    profile_runs: int = 10,
    profile_warmup: int = 3,
    samples: int = 4,
    atol: float = DEFAULT_ATOL,
    measure_requests: int = 30,
    ready_timeout_s: float = 60.0,
    experiment: str = EXPERIMENT,
) -> dict:
    """Slice ``model`` over the fleet's first ``shards`` nodes and serve it as a chain.

    ``fleet`` (or the saved EdgeFleet block ``fleet_block``; default: four loopback nodes)
    gives the nodes; ``name`` is the deployment's name (default: the model's). Returns the
    deployment's summary; raises EdgeDeployError when the check fails (after rolling back).
    """
    logger = get_run_logger()
    fleet = fleet or load_fleet(fleet_block)
    name = name or model
    nodes = preflight(model, list(fleet.nodes), shards, mode, name)
    k = len(nodes)

    progress = create_progress_artifact(0.0, description=f"edge-deploy {name}: {k} shards")

    def step(done: str) -> None:
        update_progress_artifact(progress, 100.0 * (STEPS.index(done) + 1) / len(STEPS))
        logger.info("edge-deploy %s: %s done", name, done)

    previous = current_version(name)
    version = new_version(name)
    deployment = Deployment(name, version, model, mode, "planning")
    deployment.save()
    root = deployment.root
    logger.info(
        "deploying %s as %s version %s over %s", model, name, version, [n.name for n in nodes]
    )

    experiment_id = use_experiment(experiment)
    client = mlflow.MlflowClient()
    run = client.create_run(
        experiment_id,
        run_name=f"{name}-{version}",
        tags={"gpuflow.edge.name": name, "gpuflow.edge.version": version},
    )
    run_id = run.info.run_id
    client.log_batch(
        run_id,
        params=[
            mlflow.entities.Param(key, str(value))
            for key, value in {
                "model": model,
                "shards": k,
                "mode": mode,
                "seed": seed,
                "nodes": ",".join(n.name for n in nodes),
                "version": version,
                "overrides": json.dumps(overrides or {}),
                "atol": atol,
                "profile_runs": profile_runs,
                "profile_warmup": profile_warmup,
            }.items()
        ],
    )
    try:
        exported = export_task(model, root / "model", seed=seed, overrides=overrides)
        step("export")
        client.set_tag(run_id, "gpuflow.edge.opset", str(exported.opset))
        profile = profile_task(
            exported.onnx_path,
            exported.sample_inputs(batch=1),
            runs=profile_runs,
            warmup=profile_warmup,
            intra_op_threads=nodes[0].intra_op_threads,
        )
        profile.save(root / "model" / "profile.json")
        step("profile")
        result = plan_task(exported, profile, nodes, k)
        step("plan")
        packaged = package_task(
            exported.onnx_path,
            result.cuts,
            result.dp,
            root / "shards",
            source_model=model,
            opset=exported.opset,
            version=version,
            segment_ms=result.segment_ms,
        )
        step("package")
        summary = result.summary()
        (root / "plan.json").write_text(json.dumps(summary, indent=2) + "\n")
        client.log_dict(run_id, summary, "plan.json")
        client.log_dict(
            run_id,
            {p.manifest.model_name: p.manifest.to_dict() for p in packaged},
            "manifests.json",
        )
        client.log_figure(run_id, _stage_figure(result), "stage_ms.png")
        create_table_artifact(
            _plan_rows(result),
            key=f"edge-plan-{_artifact_key(name)}",
            description=f"{model}: DP split vs equal-operator-count split over {k} nodes",
        )
        client.log_batch(
            run_id,
            metrics=[
                mlflow.entities.Metric(key, float(value), 0, 0)
                for key, value in {
                    "balance": result.dp.balance,
                    "balance_equal_ops": result.equal_ops.balance,
                    "bottleneck_ms": result.dp.bottleneck_ms,
                    "bottleneck_equal_ops_ms": result.equal_ops.bottleneck_ms,
                    "ideal_ms": result.dp.ideal_ms,
                    "profiled_total_ms": sum(result.segment_ms),
                    "cut_points": len(result.cuts.cuts),
                }.items()
            ],
        )
        launch_task(
            deployment, [p.directory for p in packaged], nodes, ready_timeout_s=ready_timeout_s
        )
        step("deploy")
    except BaseException as exc:
        deployment.status = "failed"
        deployment.note = f"{type(exc).__name__}: {exc}"
        deployment.save()
        client.set_tag(run_id, "gpuflow.edge.status", "failed")
        client.set_terminated(run_id, "FAILED")
        raise

    check = check_task(deployment, exported, samples=samples, atol=atol)
    deployment.check = check.to_dict()
    client.log_metric(run_id, "max_abs_diff", min(check.max_abs_diff, 1e30))
    step("check")
    if not check.passed:
        rolled_back = previous is not None
        stop_task(deployment, "rolled-back" if rolled_back else "failed")
        reason = check.error or f"max abs diff {check.max_abs_diff:.3g} > atol {atol:g}"
        deployment.note = f"check failed ({reason}); " + (
            f"rolled back to {previous}" if rolled_back else "no previous version to keep"
        )
        deployment.save()
        client.set_tag(run_id, "gpuflow.edge.status", deployment.status)
        client.set_terminated(run_id, "FAILED")
        raise EdgeDeployError(f"{name} {version}: {deployment.note}")

    set_current(name, version)
    deployment.status = "active"
    deployment.save()
    if previous and previous != version:
        try:
            stop_task(Deployment.load(name, previous), "superseded")
        except EdgeDeployError as exc:
            logger.warning("could not stop previous version %s: %s", previous, exc)

    metrics = measure_task(deployment, exported, requests=measure_requests)
    metrics["whole_model_local_ms"] = local_latency_ms(exported, threads=nodes[0].intra_op_threads)
    step("measure")
    client.log_batch(
        run_id,
        metrics=[mlflow.entities.Metric(k_, float(v), 0, 0) for k_, v in metrics.items()],
    )
    client.set_tag(run_id, "gpuflow.edge.status", "active")
    client.set_terminated(run_id, "FINISHED")
    return {
        "name": name,
        "version": version,
        "previous": previous,
        "run_id": run_id,
        "addresses": deployment.addresses,
        "model_names": deployment.model_names,
        "cut_tensors": result.cut_tensors(),
        "balance": result.dp.balance,
        "balance_equal_ops": result.equal_ops.balance,
        "check": check.to_dict(),
        **metrics,
    }


def _artifact_key(name: str) -> str:
    # Prefect artifact keys allow lowercase letters, digits and dashes only.
    return "".join(c if c.isalnum() else "-" for c in name.lower())
