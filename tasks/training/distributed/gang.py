"""A gang: the units a job leased, one rank each, and what each rank may see.

Every rank sees exactly its own unit and nothing else. The visibility variables are set
on the rank's process before CUDA (or HIP) initialises, and the rank then uses device 0
of what it sees:

* NVIDIA whole GPU: ``CUDA_VISIBLE_DEVICES=<index>``; a MIG instance:
  ``CUDA_VISIBLE_DEVICES=<MIG uuid>`` (the CUDA runtime accepts MIG UUIDs there).
* Hygon DCU (ROCm/DTK build of torch): ``HIP_VISIBLE_DEVICES=<index>`` (the ROCm runtime
  reads it; torch.cuda is HIP on that build). A vDCU or Hygon MIG instance is confined by
  a file the DTK/hyhal runtime reads, not by a variable: the rank also gets the paths its
  launcher must make visible (``GPUFLOW_VDCU_CONF`` at ``GPUFLOW_VDCU_RUNTIME_PATH``,
  ``GPUFLOW_DCU_MIG_CONF``; see gpuflow.hardware.hygon.confine for the sources).
* The twin: no accelerator is touched (the rank trains on the CPU, CUDA hidden); the unit it
  reports its workload to is named by ``GPUFLOW_UNIT`` like on every other vendor.

The collective backend follows the leased devices (gloo on the twin and CPU, NCCL on
NVIDIA, the ROCm build's NCCL-compatible RCCL on DCUs, which torch also calls "nccl"), and
a spec may override it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.hygon import confine

BACKENDS = ("gloo", "nccl")
UNIT_ENV = "GPUFLOW_UNIT"  # the resource id a rank trains on (the twin reports to it)
PLAN_ENV = "GPUFLOW_GANG_PLAN"  # the gang, for the rank processes (JSON)
_VISIBILITY = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPUFLOW_VDCU_ID",
    "GPUFLOW_VDCU_CONF",
    "GPUFLOW_VDCU_RUNTIME_PATH",
    "GPUFLOW_DCU_MIG_CONF",
)


@dataclass(frozen=True)
class GangUnit:
    """One leased unit, as its rank needs to know it."""

    resource_id: str
    node: str
    device_index: int
    vendor: str  # "sim", "nvidia", "hygon"
    kind: str = "device"  # device | mig | vdcu
    profile: str | None = None

    @classmethod
    def of(cls, resource: Any, backend_name: str) -> GangUnit:
        """From an inventory Resource; the twin's devices say vendor "sim"."""
        vendor = "sim" if backend_name == "sim" else str(resource.vendor).lower()
        return cls(
            resource.resource_id,
            resource.node,
            resource.device_index,
            vendor,
            resource.kind,
            resource.profile,
        )


def rank_environment(unit: GangUnit) -> dict[str, str]:
    """The variables that make ``unit`` the only device its rank sees."""
    env = {UNIT_ENV: unit.resource_id}
    if unit.vendor == "sim":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the twin trains on the CPU: no GPU in reach
    elif unit.vendor == "nvidia":
        env["CUDA_VISIBLE_DEVICES"] = (
            unit.resource_id if unit.kind == "mig" else str(unit.device_index)
        )
    elif unit.vendor == "hygon":
        # HIP sees the card; the partition's file (vDCU / MIG) is what confines the rank to it.
        env["HIP_VISIBLE_DEVICES"] = str(unit.device_index)
        if unit.kind == "vdcu":
            env["GPUFLOW_VDCU_ID"] = unit.resource_id
        env.update(confine.process_environment(unit.kind, [unit.resource_id]))
    else:
        raise InvalidRequestError(
            f"unit {unit.resource_id} has vendor {unit.vendor!r}: no way to bind a rank to it "
            "(known: sim, nvidia, hygon)"
        )
    return env


def choose_backend(units: Sequence[GangUnit], override: str | None = None) -> str:
    """gloo for the twin, NCCL for NVIDIA and DCUs (RCCL); a homogeneous gang only."""
    if override is not None:
        if override not in BACKENDS:
            raise InvalidRequestError(f"backend {override!r} is not one of: {', '.join(BACKENDS)}")
        return override
    vendors = {u.vendor for u in units}
    if len(vendors) != 1:
        raise InvalidRequestError(f"a gang spans one vendor; these units span {sorted(vendors)}")
    return "gloo" if vendors == {"sim"} else "nccl"


def check_world_sizes(job_id: str | None, batch: int, sizes: Sequence[int]) -> None:
    """Refuse a global batch that some world size the job may run at cannot split into
    equal shares (every rank takes batch / world_size rows of each global batch)."""
    bad = [n for n in sizes if n < 1 or batch % n]
    if bad:
        fits = [n for n in range(1, max(sizes) + 1) if batch % n == 0]
        raise InvalidRequestError(
            f"job {job_id!r}: global batch {batch} does not split into "
            f"{' or '.join(map(str, bad))} equal shares (one per rank); it splits for "
            f"{fits}: pick a batch size that divides by every world size the job may have"
        )


def encode_plan(units: Sequence[GangUnit]) -> str:
    return json.dumps([asdict(u) for u in units])


def decode_plan(text: str) -> list[GangUnit]:
    try:
        rows = json.loads(text)
        return [GangUnit(**row) for row in rows]
    except (ValueError, TypeError) as exc:
        raise InvalidRequestError(f"{PLAN_ENV} is not a gang plan: {exc}") from exc


def bind_this_rank(units: Sequence[GangUnit], local_rank: int, environ: Any) -> GangUnit:
    """Set this process's visibility to its unit (before CUDA starts); returns the unit."""
    if not 0 <= local_rank < len(units):
        raise InvalidRequestError(f"local rank {local_rank} has no unit in a gang of {len(units)}")
    unit = units[local_rank]
    for name in _VISIBILITY:
        environ.pop(name, None)
    environ.update(rank_environment(unit))
    return unit
