"""The twin's fleet as state over time: creation from a spec, and running it forward.

``new_state`` builds the JSON-able state from a ClusterSpec; ``sync_device`` runs one
device from its last update to ``now``: physics in closed-form segments (see
hardware.sim.physics), broken at the times something happens - a stage of an active
degradation, the onset of the next natural fault, a thermal shutdown. Devices are
independent, so each one is run lazily to the present whenever the state is touched.
"""

from __future__ import annotations

import functools
import hashlib
import uuid as uuidlib
from typing import Any

from gpuflow.hardware.sim import faults as F
from gpuflow.hardware.sim import physics, workloads
from gpuflow.hardware.sim.clock import new_clock
from gpuflow.hardware.sim.cluster_spec import ClusterSpec
from gpuflow.hardware.sim.hazard import HazardModel, draw_fault, pick_lemons
from gpuflow.hardware.skus import SkuSpec, sku

STATE_VERSION = 1
FAULT_LOG_MAX = 20_000


def stable_uuid(*parts: object) -> str:
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return str(uuidlib.UUID(bytes=digest[:16], version=4))


def device_uuid(seed: int, node: str, index: int, vendor: str) -> str:
    prefix = "GPU" if vendor == "NVIDIA" else "DCU"
    return f"{prefix}-{stable_uuid('gpuflow-device', seed, node, index)}"


def device_key(node: str, index: int) -> str:
    return f"{node}:{index}"


@functools.cache
def power_model(sku_name: str) -> physics.PowerModel:
    return physics.PowerModel.from_sku(sku(sku_name))


def sku_of(dev: dict[str, Any]) -> SkuSpec:
    return sku(dev["sku"])


def hazard_of(state: dict[str, Any]) -> HazardModel:
    return HazardModel(**state["spec"]["faults"]["hazard"])


def new_state(spec: ClusterSpec, wall_s: float | None = None) -> dict[str, Any]:
    clock = new_clock(wall_s)
    t0 = clock["epoch_s"]
    slots = spec.device_slots()
    model = spec.faults.hazard
    lemons = pick_lemons(spec.seed, len(slots), model)
    rates = model.device_rates_per_day(len(slots), lemons)
    devices: dict[str, dict[str, Any]] = {}
    for ordinal, (node, index, s) in enumerate(slots):
        ambient = spec.node(node).ambient_c
        draw = draw_fault(spec.seed, ordinal, 0, 0.0, rates[ordinal], model)
        devices[device_key(node, index)] = {
            "node": node,
            "index": index,
            "sku": s.name,
            "ordinal": ordinal,
            "uuid": device_uuid(spec.seed, node, index, s.vendor),
            "lemon": ordinal in lemons,
            "rate_per_day": rates[ordinal],
            "ambient_c": ambient,
            # Start at the idle steady state, as a machine that has been on for a while.
            "temperature_c": ambient + s.thermal_resistance_c_per_w * s.power_idle_mw / 1000.0,
            "energy_mj": 0.0,
            "last_s": t0,
            "health": "healthy",
            "fault": None,
            "failure": None,
            "counters": F.zero_counters(),
            "ecc_base_s": t0,
            "partition_mode": False,
            "partitions": [],
            "locked_min_mhz": None,
            "locked_max_mhz": None,
            "applications_sm_mhz": None,
            "applications_mem_mhz": None,
            "power_limit_mw": s.power_default_limit_mw,
            "xids": [],
            "natural_next": _draw_dict(draw, t0),
        }
    return {
        "version": STATE_VERSION,
        "generation": uuidlib.uuid4().hex,  # lets readers notice a reset
        "spec": spec.to_dict(),
        "spec_source": spec.source,
        "clock": clock,
        "natural": spec.faults.natural,
        "seq": {"xid": 0, "log": 0, "partition": 0, "inject": 0},
        "nodes": [
            {"name": n.name, "region": n.region, "role": n.role, "ambient_c": n.ambient_c}
            for n in spec.nodes
        ],
        "devices": devices,
        "workloads": {},
        "fault_log": [],
    }


def _draw_dict(draw: Any, epoch_s: float) -> dict[str, Any] | None:
    if draw is None:
        return None
    return {
        "k": draw.k,
        "onset_rel_s": draw.onset_s,
        "onset_s": epoch_s + draw.onset_s,
        "kind": draw.kind,
        "lead_s": draw.lead_s,
        "final_xid": draw.final_xid,
        "shape": F.hbm_shape_fields(draw),
    }


# -- events ------------------------------------------------------------------------------


def log_event(
    state: dict[str, Any],
    dev: dict[str, Any],
    t: float,
    event: str,
    kind: str,
    source: str,
    **extra: Any,
) -> dict[str, Any]:
    state["seq"]["log"] += 1
    entry = {
        "seq": state["seq"]["log"],
        "sim_time_s": t,
        "elapsed_s": t - state["clock"]["epoch_s"],
        "node": dev["node"],
        "index": dev["index"],
        "uuid": dev["uuid"],
        "lemon": dev["lemon"],
        "event": event,
        "kind": kind,
        "source": source,
        **extra,
    }
    log = state["fault_log"]
    log.append(entry)
    if len(log) > FAULT_LOG_MAX:
        del log[: len(log) - FAULT_LOG_MAX]
    return entry


def emit_xid(state: dict[str, Any], dev: dict[str, Any], t: float, xid: int) -> None:
    state["seq"]["xid"] += 1
    dev["xids"].append([state["seq"]["xid"], t, xid])
    if len(dev["xids"]) > F.XID_LOG_MAX:
        del dev["xids"][: len(dev["xids"]) - F.XID_LOG_MAX]


def fail_device(
    state: dict[str, Any],
    dev: dict[str, Any],
    t: float,
    *,
    kind: str,
    source: str,
    reason: str,
    xid: int | None,
    lost: bool,
) -> list[str]:
    """The device fails now: health, XID, log entry, and every tenant on it."""
    if dev["fault"] is not None:
        # Fold the degradation's accumulated corrected errors into the counters.
        dev["counters"]["ecc_corrected"] += F.hbm_corrected(dev["fault"], t)
    dev["fault"] = None
    dev["health"] = "lost" if lost else "failed"
    dev["failure"] = {"kind": kind, "at_s": t, "reason": reason, "source": source}
    if xid is not None:
        emit_xid(state, dev, t, xid)
    tenants = workloads.fail_device(state, dev["node"], dev["index"], reason)
    log_event(state, dev, t, "failure", kind, source, xid=xid, reason=reason, tenants=tenants)
    return tenants


def start_fault(
    state: dict[str, Any],
    dev: dict[str, Any],
    t: float,
    kind: str,
    source: str,
    lead_s: float,
    final_xid: int,
) -> dict[str, Any]:
    final_xid = F.sku_final_xid(sku_of(dev), final_xid)
    dev["fault"] = F.new_fault(kind, source, t, lead_s, final_xid)
    dev["health"] = "degrading"
    log_event(
        state,
        dev,
        t,
        "onset",
        kind,
        source,
        lead_s=dev["fault"]["lead_s"],
        expected_failure_s=t + dev["fault"]["lead_s"],
    )
    return dev["fault"]


def fail_abrupt(
    state: dict[str, Any], dev: dict[str, Any], t: float, kind: str, source: str, xid: int
) -> list[str]:
    s = sku_of(dev)
    if kind == "xid79":
        return fail_device(
            state,
            dev,
            t,
            kind=kind,
            source=source,
            xid=F.LOST_XID,
            lost=True,
            reason="device fell off the bus (XID 79)",
        )
    xid = F.sku_final_xid(s, xid)
    reason = F.apply_uncorrectable(s, dev["counters"], xid)
    return fail_device(state, dev, t, kind=kind, source=source, xid=xid, lost=False, reason=reason)


def apply_remap_pending(
    state: dict[str, Any], dev: dict[str, Any], t: float, kind: str, source: str
) -> None:
    F.apply_remap(sku_of(dev), dev["counters"], correctable=True)
    emit_xid(state, dev, t, 63)
    log_event(state, dev, t, "precursor", kind, source, xid=63)


def _apply_stage(state: dict[str, Any], dev: dict[str, Any], t: float, stage: str) -> None:
    fault = dev["fault"]
    fault["done"] += 1
    kind, source = fault["kind"], fault["source"]
    if stage == "remap":
        apply_remap_pending(state, dev, t, kind, source)
    elif kind == "hbm":
        s = sku_of(dev)
        xid = fault["final_xid"]
        dev["counters"]["ecc_corrected"] += F.hbm_corrected(fault, t)
        dev["fault"] = None
        reason = F.apply_uncorrectable(s, dev["counters"], xid)
        fail_device(state, dev, t, kind=kind, source=source, xid=xid, lost=False, reason=reason)
    else:  # thermal backstop
        _thermal_shutdown(state, dev, t)


def _thermal_shutdown(state: dict[str, Any], dev: dict[str, Any], t: float) -> None:
    source = dev["fault"]["source"] if dev["fault"] else "natural"
    fail_device(
        state,
        dev,
        t,
        kind="thermal",
        source=source,
        xid=F.LOST_XID,
        lost=True,
        reason="thermal shutdown (shutdown temperature reached)",
    )


def _activate_natural(state: dict[str, Any], dev: dict[str, Any], t: float) -> None:
    nxt = dev["natural_next"]
    if dev["health"] == "healthy":
        if nxt["kind"] in ("hbm", "thermal") and nxt["lead_s"] > 0:  # lead 0: a silent HBM
            start_fault(state, dev, t, nxt["kind"], "natural", nxt["lead_s"], nxt["final_xid"])
            dev["fault"].update(nxt.get("shape") or {})
        else:
            fail_abrupt(state, dev, t, nxt["kind"], "natural", nxt["final_xid"])
    # A draw that lands while the device is already down or degrading is skipped.
    spec = state["spec"]
    draw = draw_fault(
        spec["seed"],
        dev["ordinal"],
        nxt["k"] + 1,
        nxt["onset_rel_s"],
        dev["rate_per_day"],
        hazard_of(state),
    )
    dev["natural_next"] = _draw_dict(draw, state["clock"]["epoch_s"])


def repair(state: dict[str, Any], dev: dict[str, Any], t: float) -> None:
    """Reset / replace: faults and error counters cleared, healthy again."""
    previous = dev["health"]
    dev["health"] = "healthy"
    dev["fault"] = None
    dev["failure"] = None
    dev["counters"] = F.zero_counters()
    dev["ecc_base_s"] = t
    log_event(state, dev, t, "repair", "repair", "operator", previous_health=previous)


# -- running forward ---------------------------------------------------------------------


def controls(state: dict[str, Any], dev: dict[str, Any], t: float) -> physics.Controls:
    s = sku_of(dev)
    m = F.thermal_multiplier(dev["fault"], t, s, dev["ambient_c"])
    return physics.Controls(
        load=workloads.device_load(state, dev, s.compute_units),
        activity=workloads.device_activity(state, dev, s.compute_units),
        power_limit_mw=dev["power_limit_mw"],
        ambient_c=dev["ambient_c"],
        thermal_resistance_c_per_w=s.thermal_resistance_c_per_w * m,
        locked_min_mhz=dev["locked_min_mhz"],
        locked_max_mhz=dev["locked_max_mhz"],
        applications_sm_mhz=dev["applications_sm_mhz"],
        powered=dev["health"] != "lost",
    )


def operating(state: dict[str, Any], dev: dict[str, Any]) -> physics.Operating:
    """Clock, power and clock-event reasons at the device's current temperature."""
    s = sku_of(dev)
    return physics.decide(
        s, power_model(s.name), controls(state, dev, dev["last_s"]), dev["temperature_c"]
    )


def _run_physics(state: dict[str, Any], dev: dict[str, Any], t0: float, t1: float) -> float | None:
    """Advance temperature and energy from t0 to t1; the shutdown time if one happened."""
    s = sku_of(dev)
    pm = power_model(s.name)
    fault = dev["fault"]
    piece = fault["lead_s"] / F.THERMAL_PIECES if fault and fault["kind"] == "thermal" else None
    t = t0
    while t < t1:
        t_next = min(t1, t + piece) if piece else t1
        c = controls(state, dev, (t + t_next) / 2.0)
        r = physics.advance(s, pm, c, dev["temperature_c"], dev["energy_mj"], t_next - t)
        dev["temperature_c"] = r.temperature_c
        dev["energy_mj"] = r.energy_mj
        if r.shutdown_after_s is not None and c.powered:
            return t + r.shutdown_after_s
        t = t_next
    return None


def sync_device(state: dict[str, Any], dev: dict[str, Any], now: float) -> None:
    """Run one device forward to ``now``, applying every event on the way in order."""
    while dev["last_s"] < now:
        t0 = dev["last_s"]
        events: list[tuple[float, str]] = []
        if dev["fault"] is not None:
            stage = F.next_stage(dev["fault"])
            if stage is not None:
                events.append(stage)
        nxt = dev["natural_next"]
        if state["natural"] and nxt is not None:
            events.append((nxt["onset_s"], "natural"))
        event = min(events) if events else None
        t_end = now if event is None else min(now, max(event[0], t0))
        shutdown_at = _run_physics(state, dev, t0, t_end)
        if shutdown_at is not None:
            dev["last_s"] = shutdown_at
            _thermal_shutdown(state, dev, shutdown_at)
            continue
        dev["last_s"] = t_end
        if event is not None and event[0] <= now:
            if event[1] == "natural":
                _activate_natural(state, dev, t_end)
            else:
                _apply_stage(state, dev, t_end, event[1])


def sync_all(state: dict[str, Any], now: float) -> None:
    for dev in state["devices"].values():
        sync_device(state, dev, now)
