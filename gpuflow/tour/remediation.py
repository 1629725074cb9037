"""The tour's predicted fault: a job trains on an A100, its HBM starts to degrade, the
health monitor sees it, `remediate` moves the job, and it finishes elsewhere.

For `gpuflow demo` (on the twin, in the tour's GPUFLOW_HOME). What it calls is the
production path: InProcessRunner, run_monitor (fast-forwarding the twin between rounds)
deciding by cost over the tour's inventory (tasks.remediation.costs), and the remediate flow with the parameters its deployment trigger renders from the
health-risk event. The event itself is not sent to Prefect: the tour records into the
Prefect database `gpuflow up` serves, where the `remediate` deployment's trigger would
act on it in *your* GPUFLOW_HOME (its fleet, its jobs), not in the tour's twin.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError

Report = Callable[[str], None]


def _health_model(model_uri: str | None = None) -> tuple[Any, str]:
    """The monitor's model (``model_uri``, else the registered champion by cost, whatever
    its kind, else the threshold rules), named with the horizon of its risk."""
    from gpuflow.tasks.health.monitor import RULES_URI, describe_model, load_health_model

    model, source = load_health_model(model_uri)
    if source.startswith(RULES_URI):
        return model, "threshold rules (no champion registered yet)"
    return model, f"champion by cost: {describe_model(model, source)}"


def _challenger(model_uri: str | None) -> tuple[Any, str | None]:
    """The challenger registered beside that champion, scored in shadow, or (None, None)."""
    from gpuflow.tasks.health.monitor import describe_model
    from gpuflow.tasks.health.registry import load_challenger

    model, source = load_challenger(model_uri)
    return (model, describe_model(model, source)) if model is not None else (None, None)


class ShadowWatch:
    """What the challenger decided on one device, round by round (the monitor's on_round)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.acted: tuple[int, dict[str, Any]] | None = None  # (round, its decision)
        self.last: dict[str, Any] | None = None  # its decision in the latest round
        self.max_risk = 0.0  # its highest risk on the device over the rounds

    def __call__(self, round_no: int, report: Any) -> None:
        shadow = report.shadow
        if shadow is None:
            return
        for e in shadow.emitted:
            if e["device"] == self.device and self.acted is None:
                self.acted = (round_no, e)
        for r in shadow.risks:
            if f"{r.node}:{r.index}" == self.device:
                self.max_risk = max(self.max_risk, r.risk)
        decided = shadow.decisions.get(self.device)
        if decided is not None:
            self.last = decided.to_dict()

    def line(self, name: str, champion_round: int) -> str:
        """One line for the tour: whether and when the challenger would have acted."""
        if self.acted is not None:
            at, e = self.acted
            ahead = champion_round - at
            when = (
                f"{ahead * 10} twin-minutes before the champion"
                if ahead > 0
                else "in the same round as the champion"
            )
            level = e.get("break_even_risk")
            return (
                f"{name}: would have acted ({e['action']}, {e['decided_by']}) after {at} "
                f"rounds, {when}: risk {e['risk']:.4f}"
                + (f" >= break-even {level:.4f}" if level is not None else "")
            )
        d = self.last or {}
        level = d.get("break_even_risk")
        return (
            f"{name}: would not have acted by then ({d.get('action', 'no decision')}): risk "
            f"{d.get('risk', 0.0):.4f} now, at most {self.max_risk:.4f} over the rounds"
            + (f", break-even {level:.4f}" if level is not None else "")
        )


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
    model_uri: str | None = None,
) -> dict[str, Any]:
    """Run the scenario on the twin in GPUFLOW_HOME, the monitor scoring with ``model_uri``
    (default: as the monitor flow does); returns what happened."""
    import torch

    from gpuflow.blocks.checkpoint_storage import CheckpointStorage
    from gpuflow.blocks.gpu_cluster import GpuCluster
    from gpuflow.flows.remediate import remediate
    from gpuflow.hardware.inventory import Inventory
    from gpuflow.tasks.health.events import health_risk_payload, resource_id_for
    from gpuflow.tasks.health.monitor import monitor_dir, run_monitor
    from gpuflow.tasks.remediation.costs import FleetCosts
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

        model, model_name = _health_model(model_uri)
        challenger, challenger_name = _challenger(model_uri)
        watch = ShadowWatch(f"{node}:{index}")
        events: list[dict[str, Any]] = []

        def keep(
            n: str,
            i: int,
            risk: float,
            features: dict[str, float],
            sku: str,
            reason: str = "model",
            missing: Sequence[str] = (),
            horizon_s: float = 1800.0,
            decision: Any = None,
        ) -> str:
            # In place of emit_health_risk (see the module docstring): the same payload,
            # validated, and an id of the tour's own.
            payload = health_risk_payload(
                n, i, risk, features, sku, reason, missing, horizon_s, decision
            )
            event_id = str(uuid.uuid4())
            events.append({"node": n, "index": i, "payload": payload, "event_id": event_id})
            return event_id

        rounds = 0
        while rounds < max_monitor_rounds:
            rounds += 1
            run_monitor(
                backend,
                model,
                rounds=1,
                emit=keep,
                state_dir=monitor_dir(),
                costs=lambda: FleetCosts(control),
                model_name=model_name,
                challenger=challenger,
                challenger_name=challenger_name,
                on_round=lambda _i, report, n=rounds: watch(n, report),
            )
            if any((e["node"], e["index"]) == (node, int(index)) for e in events):
                break
            backend.advance(600.0)  # the twin fast-forwards 10 minutes between rounds
        ev = next((e for e in events if (e["node"], e["index"]) == (node, int(index))), None)
        if ev is None:
            raise InvalidRequestError(
                f"the monitor ({model_name}) raised no event for {node}:{index} in {rounds} rounds"
            )
        risk = ev["payload"]["risk"]
        decision = ev["payload"]["decision"]
        report(
            f"monitor ({model_name}): risk {risk:.2f} on {node}:{index} "
            f"after {rounds} rounds ({rounds * 10} twin-minutes); {decision['action']} "
            f"({decision['decided_by']}): {decision['why']}"
        )
        result = remediate(
            resource_id=resource_id_for(node, int(index)),
            payload=ev["payload"],
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
            "risk": round(risk, 3),
            "challenger (in shadow)": watch.line(challenger_name, rounds)
            if challenger is not None
            else "none registered",
            "decision": f"{decision['action']} ({decision['decided_by']}, drain level "
            f"{decision['drain_risk']:g}, break-even {decision.get('break_even_risk')})",
            "top features": ev["payload"]["top_features"],
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


def predicted_fault_step(steps: int, model_uri: str | None = None) -> dict[str, Any]:
    """The scenario as the tour runs it: the monitor scores with the champion the tour
    trained (``model_uri``); the operators' message goes to the tour's inbox."""
    from gpuflow.tour.inbox import Inbox

    with Inbox() as inbox:
        out = predicted_fault_tour(
            report=lambda _msg: None, steps=steps, notifier=inbox.block(), model_uri=model_uri
        )
    out["operators told"] = (
        inbox.messages[-1].get("subject", "").strip() if inbox.messages else None
    )
    return out
