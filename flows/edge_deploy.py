"""Flow `edge-deploy`: export ─ profile ─ plan cuts ─ package ─ deploy ─ check ─ promote |
roll back ─ (stable endpoint).

A model is sliced into k shards by measured operator cost, each shard served over the Open
Inference Protocol on one node of an EdgeFleet (local processes on loopback by default),
and the chain's output is checked against the whole model's. Only a chain that passes
becomes the current version (the previous one keeps running as the standby that
`gpuflow edge rollback` returns to; an older standby is stopped) and is measured; one that
fails is stopped and the previous version keeps serving. A forwarding chain is reached at
one stable endpoint per name, whichever version serves (`endpoint` in the summary). The MLflow run
(experiment "edge") carries the plan, the balance of the DP split and of the
equal-operator-count split, the check, latency and throughput; a run whose flow fails is
marked FAILED.
"""

from __future__ import annotations

from typing import Literal

from gpuflow.blocks.edge_fleet import EdgeFleet, EdgeNode, load_fleet
from gpuflow.tasks.edge.deploy import Deployment, launch_task
from gpuflow.tasks.edge.export import export_task
from gpuflow.tasks.edge.home import EdgeDeployError, check_name
from gpuflow.tasks.edge.nodes import check_reachable
from gpuflow.tasks.edge.package import package_task
from gpuflow.tasks.edge.planning import (
    plan_message,
    plan_nodes,
    plan_task,
    save_plan_costs,
    stored_plan_costs,
    stored_profile,
)
from gpuflow.tasks.edge.profile import profile_task
from gpuflow.tasks.edge.recording import (
    failed_run_on_error,
    finish_edge_run_task,
    open_edge_run_task,
    record_check_task,
    record_export_task,
    record_plan_task,
)
from gpuflow.tasks.edge.report import deploy_summary, progress_steps, publish_plan
from gpuflow.tasks.edge.rollout import failed_build, promote_task, roll_back_task, start_version
from gpuflow.tasks.edge.stable_endpoint import ensure_endpoint_task
from gpuflow.tasks.edge.verify import DEFAULT_ATOL, check_task, local_latency_ms, measure_task
from gpuflow.tasks.training.models.registry import model_spec
from prefect import flow, get_run_logger

EXPERIMENT = "edge"


def preflight(
    model: str, nodes: list[EdgeNode], shards: int | None, mode: str, name: str
) -> list[EdgeNode]:
    """Reject bad input before anything is written or started; the nodes the planner may
    use (all of the fleet's: it chooses which serve and in which order)."""
    model_spec(model)  # ValueError listing the known models
    if mode not in ("forward", "driver"):
        raise ValueError(f"mode must be 'forward' or 'driver', got {mode!r}")
    if shards is not None and (not isinstance(shards, int) or isinstance(shards, bool)):
        raise ValueError(f"shards must be a positive int or None, got {shards!r}")
    if shards is not None and shards < 1:
        raise ValueError(f"shards must be a positive int or None, got {shards!r}")
    if shards is not None and shards > len(nodes):
        raise ValueError(f"{shards} shards need {shards} edge nodes but the fleet has {len(nodes)}")
    check_name(name)
    for node in nodes:
        check_reachable(node)
    return nodes


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
    reprofile: bool = False,
) -> dict:
    """Slice ``model`` into ``shards`` shards (None: as many as pay, one included) on the
    fleet's best nodes, in the best order, and serve it as a chain.

    ``fleet`` (or the saved EdgeFleet block ``fleet_block``; default: four loopback nodes)
    gives the nodes the planner chooses from; ``name`` is the deployment's name (default: the model's). A redeploy of
    the same export reuses the current version's profile (the same cuts) unless
    ``reprofile``. Returns the deployment's summary; raises EdgeDeployError when the check
    fails (after rolling back).
    """
    logger = get_run_logger()
    fleet = fleet or load_fleet(fleet_block)
    name = name or model
    nodes = preflight(model, list(fleet.nodes), shards, mode, name)
    step = progress_steps(name, shards or len(nodes), logger)
    previous, deployment = start_version(name, model, mode)
    version, root = deployment.version, deployment.root
    logger.info(
        "deploying %s as %s version %s, choosing among %s",
        model,
        name,
        version,
        [n.name for n in nodes],
    )
    run_id = open_edge_run_task(
        experiment,
        deployment,
        nodes,
        seed=seed,
        overrides=overrides,
        atol=atol,
        profile_runs=profile_runs,
        profile_warmup=profile_warmup,
    )
    with failed_run_on_error(run_id, deployment):
        with failed_build(deployment):
            exported = export_task(model, root / "model", seed=seed, overrides=overrides)
            step("export")
            record_export_task(run_id, exported)
            threads = nodes[0].intra_op_threads
            before = Deployment.load(name, previous) if previous and not reprofile else None
            profile = stored_profile(before, exported, threads)
            reused_from = previous if profile is not None else None
            stored = stored_plan_costs(before) if profile is not None else None
            if profile is None:
                profile = profile_task(
                    exported.onnx_path,
                    exported.sample_inputs(batch=1),
                    runs=profile_runs,
                    warmup=profile_warmup,
                    intra_op_threads=threads,
                )
            else:
                logger.info(
                    "the export is %s's: its profile is reused (reprofile=True measures)", previous
                )
            profile.save(root / "model" / "profile.json")
            step("profile")
            result = plan_task(exported, profile, nodes, shards, stored=stored)
            save_plan_costs(result, root / "model")
            nodes = plan_nodes(result, nodes)
            logger.info(plan_message(result))
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
            publish_plan(deployment, result)
            record_plan_task(run_id, result, packaged)
            launch_task(
                deployment, [p.directory for p in packaged], nodes, ready_timeout_s=ready_timeout_s
            )
            step("deploy")

        check = check_task(deployment, exported, samples=samples, atol=atol)
        record_check_task(run_id, check)
        step("check")
        if not check.passed:
            note = roll_back_task(deployment, previous, check)
            raise EdgeDeployError(f"{name} {version}: {note}")
        promote_task(deployment, previous, check)
        # One address for every version of the name (a forwarding chain's head behind it).
        endpoint = ensure_endpoint_task(name, nodes[0].host) if mode == "forward" else None

        metrics = measure_task(deployment, exported, requests=measure_requests)
        metrics["whole_model_local_ms"] = local_latency_ms(
            exported, threads=nodes[0].intra_op_threads
        )
        step("measure")
        finish_edge_run_task(run_id, metrics)
    return deploy_summary(deployment, previous, run_id, result, check, metrics) | {
        "endpoint": endpoint,
        "profile_reused_from": reused_from,
    }
