"""Flow `monitor`: sample every device ─ update its window ─ score ─ decide ─ emit.

Runs ``rounds`` samples ``interval_s`` apart (a deployment on an interval schedule of
rounds x interval runs it back to back); the window state and the open incidents live
under GPUFLOW_HOME/health/monitor, so each run continues the last one. Every round each
device's risk is decided by cost (tasks.health.decision) with the numbers of the jobs on
it, read from the cluster's inventory (tasks.remediation.costs): a device whose expected
loss exceeds the cost of checkpoint + migration ("act"), at or above ``threshold`` (the
drain-at-once level, 0.85) or gone (risk 1.0, "device lost") gets one
``gpuflow.device.health-risk`` event per incident, carrying the decision; the
``remediate`` deployment's trigger starts on it.

Beside the champion the registered challenger (the cheapest model of another kind on
validation) is scored in shadow: decided by the same rule, recorded, never acted on; the
run's artifact sets the two side by side (tasks.health.shadow).
"""

from __future__ import annotations

from typing import Any

from gpuflow.tasks.cluster import load_cluster
from gpuflow.tasks.health.decision import CostDefaults, DeviceCosts
from gpuflow.tasks.health.monitor import (
    DEFAULT_THRESHOLD,
    CostLookup,
    RoundReport,
    describe_model,
    load_challenger_task,
    load_health_model_task,
    monitor_dir,
    run_monitor_task,
    validate_thresholds,
)
from gpuflow.tasks.health.sampler import DEFAULT_INTERVAL_S, validate_interval_s
from gpuflow.tasks.health.shadow import scorecard_rows
from gpuflow.tasks.node_scope import node_backend
from gpuflow.tasks.remediation.costs import FleetCosts
from gpuflow.tasks.worker_queues import node_queue_name
from prefect import flow, get_run_logger
from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)


@flow(name="monitor", log_prints=True)
def monitor(
    cluster_block: str | None = None,
    rounds: int = 12,
    interval_s: float = DEFAULT_INTERVAL_S,
    threshold: float = DEFAULT_THRESHOLD,
    clear_threshold: float | None = None,
    model_uri: str | None = None,
    fast_forward: bool = False,
    node: str | None = None,
    costs: dict[str, float] | None = None,
    challenger_uri: str | None = None,
) -> dict[str, Any]:
    """Watch the fleet for ``rounds`` x ``interval_s`` seconds. ``threshold``: the
    drain-at-once level (the cost rule acts below it). ``model_uri``: None for the
    registered champion (the threshold rules until one exists), "rules", or an MLflow
    URI. ``fast_forward`` (twin only): advance the twin's clock instead of sleeping.
    ``node``: watch that node only (a host's own monitor, gpuflow.controlplane_nodes).
    ``costs``: overrides of the cost defaults for jobs without a measurement
    (checkpoint_save_s, restart_s, relaunch_s, gpu_failures_per_day). ``challenger_uri``:
    the model scored in shadow; None for the registered challenger beside a registered
    champion, "none" for no shadow, or an MLflow URI."""
    logger = get_run_logger()
    interval_s = validate_interval_s(interval_s)
    validate_thresholds(threshold, clear_threshold)
    defaults = CostDefaults.of(costs)  # a bad cost is refused before anything is sampled
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    cluster = load_cluster(cluster_block)
    backend = node_backend(cluster.get_backend(), node)
    wait = None
    if fast_forward:
        advance = getattr(backend, "advance", None)
        if advance is None:
            raise ValueError(
                f"fast_forward needs the digital twin; this cluster runs {backend.name!r}"
            )
        wait = advance
    model, uri = load_health_model_task(model_uri)
    source = describe_model(model, uri)  # which model and horizon decide, in every event
    challenger, challenger_source = load_challenger_task(model_uri, challenger_uri)
    shadow_source = describe_model(challenger, challenger_source) if challenger else None
    inventory = cluster.get_inventory()
    logger.info(
        "monitor: %d rounds every %g s, model %s; decided by cost (defaults %s), "
        "drain at once at risk >= %g; in shadow: %s",
        rounds,
        interval_s,
        source,
        defaults.to_dict(),
        threshold,
        shadow_source or "no challenger",
    )
    progress_id = create_progress_artifact(0.0, description=f"monitor: {rounds} rounds")

    def on_round(i: int, report: RoundReport) -> None:
        update_progress_artifact(progress_id, round(100.0 * (i + 1) / rounds, 1))
        for e in report.emitted:
            logger.warning(
                "health-risk event %s for %s (%s): %s %s",
                e["event_id"],
                e["device"],
                e["reason"],
                e["decision"],
                e["top_features"],
            )
        for key in report.cleared:
            logger.info("incident closed for %s", key)
        for e in report.shadow.emitted if report.shadow else ():
            logger.info("challenger (shadow, not acted on) on %s: %s", e["device"], e["decision"])

    def round_costs() -> CostLookup:
        # An unreadable inventory must not stop the watch: the drain level still decides.
        try:
            return FleetCosts(inventory, defaults)
        except Exception as exc:  # noqa: BLE001 - any store error: judge without costs
            logger.warning("inventory unreadable, deciding at the drain level only: %s", exc)
            unknown = DeviceCosts(jobs_known=False, note=f"inventory unreadable ({exc})"[:200])
            return lambda _node, _index: unknown

    kwargs: dict[str, Any] = {
        "rounds": rounds,
        "interval_s": interval_s,
        "threshold": threshold,
        "clear_threshold": clear_threshold,
        "on_round": on_round,
        "costs": round_costs,
        "model_name": source,
        "challenger": challenger,
        "challenger_name": shadow_source,
    }
    if node is not None:
        # Its own windows and incidents: a monitor closes the incidents of devices it no
        # longer sees, which would be every other node's.
        kwargs["state_dir"] = monitor_dir() / node_queue_name(node)
    if wait is not None:
        kwargs["wait"] = wait
    result = run_monitor_task(backend, model, **kwargs)
    top = sorted(result.max_risk.items(), key=lambda kv: -kv[1])[:20]
    decided = {k: inc.get("decision", {}) for k, inc in result.open_incidents.items()}
    create_table_artifact(
        [
            {
                "device": k,
                "max_risk": v,
                "open_incident": k in result.open_incidents,
                "action": decided.get(k, {}).get("action", ""),
                "break_even_risk": decided.get(k, {}).get("break_even_risk"),
            }
            for k, v in top
        ],
        key="monitor-risks",
        description=f"Highest risks of this run (model {source}, drain level {threshold:g})",
    )
    if result.shadow is not None:
        card = result.shadow["scorecard"]
        create_table_artifact(
            scorecard_rows(card),
            key="monitor-champion-vs-challenger",
            description=(
                f"Champion and challenger (in shadow) since the pair started: "
                f"{card['failures']} failures seen"
            ),
        )
    return {**result.to_dict(), "model": source}
