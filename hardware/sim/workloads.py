"""Tenants on the twin's devices and what sharing means for them. Pure (state dicts).

A tenant (``owner``: a job, a serving replica...) runs on a whole device or on one hard
partition (MIG instance, vDCU) with a utilization ratio and some memory. Sharing
semantics follow NVIDIA's MPS and MIG documentation (DESIGN.md section 4):

* on an unpartitioned device the tenants share one context space, as under MPS: a fatal
  error in one reaches every tenant of that device;
* on a hard partition a fatal error stays inside the partition: only its tenants fail;
* a device failure fails every tenant on the device, whatever the partitioning.

Utilization is computed from what runs: on an unpartitioned device min(1, sum of the
tenants' ratios); on a partitioned one each partition adds its share of the device
(compute slices / 7 for MIG, compute units / total for a vDCU) times min(1, its
tenants' sum). Failed tenants use nothing.

A tenant may carry a character (hardware.sim.dvfs_model): ``memory_bound_ratio`` and
``activity``, None for the cluster spec's default. What its kernels draw sets the device's
activity: the mean of its running tenants' activities, weighted by their share of the load.
"""

from __future__ import annotations

from typing import Any

from gpuflow.hardware.placement import MIG_COMPUTE_SLICES
from gpuflow.hardware.sim.cluster_spec import DEFAULT_ACTIVITY, DEFAULT_MEMORY_BOUND_RATIO

RUNNING = "running"


def is_running(w: dict[str, Any]) -> bool:
    return w["status"] == RUNNING


def tenants_of(
    state: dict[str, Any], node: str, index: int, *, running_only: bool = True
) -> dict[str, dict[str, Any]]:
    return {
        owner: w
        for owner, w in sorted(state["workloads"].items())
        if w["node"] == node and w["index"] == index and (is_running(w) or not running_only)
    }


def partition_share(dev: dict[str, Any], part: dict[str, Any], compute_units_total: int) -> float:
    if part["kind"] == "mig":
        return part["compute_slices"] / MIG_COMPUTE_SLICES
    return (part["compute_units"] or 0) / max(compute_units_total, 1)


def device_load(state: dict[str, Any], dev: dict[str, Any], compute_units_total: int) -> float:
    """NVML-style utilization (share of time a kernel ran) from the running tenants."""
    if dev["health"] in ("failed", "lost"):
        return 0.0
    tenants = tenants_of(state, dev["node"], dev["index"])
    if not tenants:
        return 0.0
    whole = sum(w["utilization_ratio"] for w in tenants.values() if w["partition"] is None)
    load = min(whole, 1.0)
    for part in dev["partitions"]:
        used = sum(
            w["utilization_ratio"] for w in tenants.values() if w["partition"] == part["uuid"]
        )
        load += partition_share(dev, part, compute_units_total) * min(used, 1.0)
    return min(load, 1.0)


def character(state: dict[str, Any], w: dict[str, Any] | None) -> tuple[float, float]:
    """(memory_bound_ratio, activity) of tenant ``w``: what it reported, else the cluster
    spec's defaults (also for ``w`` None: a tenant not registered yet)."""
    d = state["spec"].get("workload_defaults") or {}  # absent in states from before them
    m = None if w is None else w.get("memory_bound_ratio")
    a = None if w is None else w.get("activity")
    return (
        float(m if m is not None else d.get("memory_bound_ratio", DEFAULT_MEMORY_BOUND_RATIO)),
        float(a if a is not None else d.get("activity", DEFAULT_ACTIVITY)),
    )


def device_activity(state: dict[str, Any], dev: dict[str, Any], compute_units_total: int) -> float:
    """What the device's kernels draw: its running tenants' activities, weighted by the
    load each brings (utilization, times the partition's share on a partition)."""
    parts = {p["uuid"]: p for p in dev["partitions"]}
    num = den = 0.0
    for w in tenants_of(state, dev["node"], dev["index"]).values():
        if w["partition"] is None:
            weight = w["utilization_ratio"]
        elif w["partition"] in parts:
            weight = w["utilization_ratio"] * partition_share(
                dev, parts[w["partition"]], compute_units_total
            )
        else:
            continue  # its partition is gone: it runs nothing (as device_load counts it)
        num += weight * character(state, w)[1]
        den += weight
    return num / den if den > 0 else character(state, None)[1]


def memory_used_mb(state: dict[str, Any], dev: dict[str, Any], partition: str | None = None) -> int:
    """Memory held by running tenants on the device (or on one partition of it)."""
    if dev["health"] in ("failed", "lost"):
        return 0
    return sum(
        w["memory_mb"]
        for w in tenants_of(state, dev["node"], dev["index"]).values()
        if partition is None or w["partition"] == partition
    )


def fail(state: dict[str, Any], owners: list[str], reason: str) -> list[str]:
    """Mark running tenants failed; returns those whose status changed."""
    changed = []
    for owner in owners:
        w = state["workloads"].get(owner)
        if w is not None and is_running(w):
            w["status"] = f"failed: {reason}"
            changed.append(owner)
    return changed


def fail_device(state: dict[str, Any], node: str, index: int, reason: str) -> list[str]:
    """A device failure takes every tenant on it down."""
    return fail(state, list(tenants_of(state, node, index)), reason)


def fatal_error_scope(state: dict[str, Any], owner: str) -> list[str]:
    """Who an application fatal error in ``owner`` takes down (owner first)."""
    w = state["workloads"][owner]
    peers = tenants_of(state, w["node"], w["index"])
    if w["partition"] is None:
        scope = [o for o, p in peers.items() if p["partition"] is None]  # MPS-like: all
    else:
        scope = [o for o, p in peers.items() if p["partition"] == w["partition"]]
    return [owner] + [o for o in scope if o != owner]
