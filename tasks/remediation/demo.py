"""The tour's predicted fault: a job trains on an A100, its HBM starts to degrade, the
health monitor raises the event, `remediate` moves the job, and it finishes elsewhere.

For `gpuflow demo` (on the twin, in the tour's GPUFLOW_HOME); everything it calls is the
production path: InProcessRunner, run_monitor (fast-forwarding the twin between rounds),
the event, and the remediate flow with the parameters its deployment trigger renders.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError

Report = Callable[[str], None]


def _health_model(window: int) -> tuple[Any, str]:
    """The registered champion if there is one, else the threshold rules (said so)."""
    try:
        from gpuflow.tasks.health.model import load_champion

        return load_champion(), "LSTM champion (MLflow registry)"
    except Exception:  # noqa: BLE001 - no registry, no model: the rules still see HBM remaps
        from gpuflow.tasks.health.baselines import RuleModel

        return RuleModel(window), "threshold rules (no LSTM champion registered yet)"


def _time_to_recover_s(timeline: list[dict[str, Any]]) -> float | None:
    """From the risk being seen to the job running again elsewhere (wall seconds)."""
    from gpuflow.tasks.remediation.ledger import JOB_RESUMED, RISK_SEEN

    seen = next((e["at_s"] for e in timeline if e["what"] == RISK_SEEN), None)
    resumed = next((e["at_s"] for e in timeline if e["what"] == JOB_RESUMED), None)
    return None if seen is None or resumed is None else round(resumed - seen, 1)


def predicted_fault_tour(
    report: Report = print,
    steps: int = 300,
    notifier: Any = None,
    max_monitor_rounds: int = 40,
) -> dict[str, Any]:
    """Run the scenario on the twin in GPUFLOW_HOME; returns what happened."""
    import torch
    from gpuflow.blocks.checkpoint_storage import CheckpointStorage
    from gpuflow.blocks.gpu_cluster import GpuCluster
    from gpuflow.flows.remediate import remediate
    from gpuflow.hardware.inventory import Inventory
    from gpuflow.tasks.health.events import emit_health_risk, health_risk_payload, resource_id_for
    from gpuflow.tasks.health.features import WINDOW_BUCKETS
    from gpuflow.tasks.health.monitor import monitor_dir, run_monitor
    from gpuflow.tasks.remediation.launch import RUNNER
    from gpuflow.tasks.training.binding import DeviceRequest
    from gpuflow.tasks.training.spec import TrainSpec

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a toy job next to the monitor: one thread each
    try:
        cluster = GpuCluster(backend="sim")
        backend = cluster.get_backend()
        Inventory().sync(backend)
        spec = TrainSpec(
            job_id="tour-remediate",
            model="llama-tiny",
            steps=steps,
            checkpoint_interval=max(steps // 6, 1),
            batch_size=2,
            seq_len=16,
            precision="fp32",
            eval_batches=1,
        )
        going = threading.Event()
        control = Inventory()

        def hold(info: Any) -> None:
            # A real job trains for hours while its HBM degrades; the tour's toy job would
            # be done before the monitor's first round. So it waits at one step until
            # remediation asks it for a checkpoint (bounded: it never hangs the tour).
            if info.step == steps // 3:
                going.set()
                for _ in range(1200):
                    if control.poll_control(spec.job_id) is not None:
                        return
                    time.sleep(0.1)

        handle = RUNNER.start(
            spec, CheckpointStorage(), cluster, DeviceRequest(sku="a100-40gb"), step_hooks=(hold,)
        )
        if not going.wait(120):
            raise InvalidRequestError("the tour's training job did not start")
        node, index = handle.segments[0].device.split(":")
        report(f"job {spec.job_id} trains on {node}:{index}; injecting HBM degradation there")
        backend.inject_fault(node, int(index), "hbm", lead_s=4 * 3600.0)

        model, model_name = _health_model(WINDOW_BUCKETS)
        events: list[dict[str, Any]] = []

        def emit(
            n: str, i: int, risk: float, features: dict[str, float], sku: str, reason: str = "model"
        ) -> str:
            event_id = emit_health_risk(n, i, risk, features, sku, reason=reason)
            events.append(
                {
                    "node": n,
                    "index": i,
                    "risk": risk,
                    "features": features,
                    "sku": sku,
                    "reason": reason,
                    "event_id": event_id,
                }
            )
            return event_id

        rounds = 0
        while rounds < max_monitor_rounds:
            rounds += 1
            run_monitor(backend, model, rounds=1, emit=emit, state_dir=monitor_dir())
            if any((e["node"], e["index"]) == (node, int(index)) for e in events):
                break
            backend.advance(600.0)  # the twin fast-forwards 10 minutes between rounds
        ev = next((e for e in events if (e["node"], e["index"]) == (node, int(index))), None)
        if ev is None:
            raise InvalidRequestError(
                f"the monitor ({model_name}) raised no event for {node}:{index} in {rounds} rounds"
            )
        report(
            f"monitor ({model_name}): risk {ev['risk']:.2f} on {node}:{index} "
            f"after {rounds} rounds ({rounds * 10} twin-minutes)"
        )
        result = remediate(
            resource_id=resource_id_for(node, int(index)),
            payload=health_risk_payload(
                node, int(index), ev["risk"], ev["features"], ev["sku"], ev["reason"]
            ),
            event_id=ev["event_id"],
            trigger="predicted",
            notifier=notifier,
            cluster=cluster,
        )
        finished = handle.wait(300)
        moved = result["jobs"].get(spec.job_id, {})
        first = handle.segments[0]
        last = handle.segments[-1]
        return {
            "device": f"{node}:{index}",
            "health model": model_name,
            "risk": round(ev["risk"], 3),
            "top features": ev["features"],
            "remediation": result["status"],
            "moved to": moved.get("target"),
            "checkpoint": moved.get("checkpoint_id"),
            "steps lost": (first.last_step or 0) - (last.resumed_from_step or 0)
            if len(handle.segments) > 1
            else None,
            "job finished": finished and handle.finished,
            "cordoned": Inventory().is_cordoned(node, int(index)),
            "time to recover s": _time_to_recover_s(result.get("timeline", [])),
            "timeline": [e["what"] for e in result.get("timeline", [])],
        }
    finally:
        torch.set_num_threads(threads)
