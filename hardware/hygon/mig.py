"""MIG on newer Hygon drivers (``hy-smi mig``, which mirrors ``nvidia-smi mig``).

``-cgi <gi profile id> -C -i DEV`` creates a GPU instance with its compute instance; the
driver picks the placement. The MIG *mode* switch (``hy-smi -mig 0|1``) is node-wide and
refused while any process holds /dev/kfd, and with it on and nothing carved every card is
unusable, so it is an operator provisioning step: nothing here flips it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from gpuflow.hardware.backend import (
    HardwareError,
    InvalidRequestError,
    Partition,
    PartitionRequest,
    UnsupportedError,
)
from gpuflow.hardware.hygon import parse as hp
from gpuflow.hardware.hygon.command import HySmi, status_error
from gpuflow.hardware.hygon.inventory import Dcu
from gpuflow.hardware.placement import Occupied, fit_mig


def mig_uuid(device: int, gi: int) -> str:
    # Hygon's own MIG identity lives in /etc/dmi_mig_config/ci/*.conf, which no CLI shows;
    # this name is gpuflow's, stable for the life of the GPU instance.
    return f"dcu{device}-mig-gi{gi}"


def mig_gi(uuid: str) -> int:
    """The GPU instance id inside a mig_uuid."""
    return int(uuid.rsplit("gi", 1)[1])


def instances(hy: HySmi, dcu: Dcu) -> list[hp.MigInstanceRow]:
    # nvidia-smi exits non-zero when there is no instance; the text says so.
    proc = hy.run(["mig", "-lgi", "-i", str(dcu.index)], check=False)
    if proc.returncode != 0 and not hp.mig_none_found(proc.stdout):
        raise status_error(proc)
    rows = hp.parse_mig_instances(proc.stdout, f"hy-smi mig -lgi -i {dcu.index}")
    return [r for r in rows if r.device == dcu.index]


def partitions(hy: HySmi, node_name: str, dcu: Dcu) -> list[Partition]:
    sizes = {p.profile_id: p.memory_mb for p in dcu.mig_profiles}
    return [
        Partition(
            node=node_name,
            device_index=dcu.index,
            uuid=mig_uuid(dcu.index, r.instance_id),
            profile=r.name,
            kind="mig",
            memory_mb=sizes.get(r.profile_id, 0),
            placement_start=r.start,
            placement_size=r.size,
        )
        for r in instances(hy, dcu)
    ]


def check_requests(
    label: str, dcu: Dcu, reqs: list[PartitionRequest], notes: Sequence[str]
) -> None:
    """Everything static about MIG requests: fields, then the profiles' fit (no command)."""
    if "mig" not in dcu.kinds:
        raise UnsupportedError(
            f"{label} offers no MIG profiles through `hy-smi mig` ({'; '.join(notes)})"
        )
    for i, r in enumerate(reqs):
        if r.compute_units is not None or r.memory_mb is not None:
            raise InvalidRequestError(
                f"MIG request {i}: compute_units/memory_mb apply to vDCUs only"
            )
        if r.placement_start is not None:
            raise UnsupportedError(
                f"MIG request {i}: hy-smi's documented `mig -cgi <id>` takes no placement; "
                "the driver places the instance"
            )
    fit_mig(label, dcu.mig_profiles, reqs)


def create(
    hy: HySmi, node_name: str, label: str, dcu: Dcu, reqs: list[PartitionRequest]
) -> list[Partition]:
    """Create checked ``reqs`` next to the instances the DCU already has."""
    before = instances(hy, dcu)
    fit_mig(
        label,
        dcu.mig_profiles,
        reqs,
        existing=[Occupied(r.start, r.size, r.size) for r in before],
        existing_counts=Counter(r.name for r in before),
    )
    by_name = {p.name: p for p in dcu.mig_profiles}
    # Largest first: Hygon's placements are aligned power-of-two blocks, so placing the
    # biggest first always finds room when the layout fits (fit_mig proved it does).
    order = sorted(reqs, key=lambda r: -by_name[r.profile].placement_size)
    for r in order:
        hy.run(["mig", "-cgi", str(by_name[r.profile].profile_id), "-C", "-i", str(dcu.index)])
    known = {r.instance_id for r in before}
    new = [p for p in partitions(hy, node_name, dcu) if mig_gi(p.uuid) not in known]
    if sorted(p.profile for p in new) != sorted(r.profile for r in reqs):
        raise HardwareError(
            f"after hy-smi mig -cgi on DCU {dcu.index} the new instances are "
            f"{sorted(p.profile for p in new)}, not the requested {sorted(r.profile for r in reqs)}"
        )
    return new


def destroy(hy: HySmi, dcu: Dcu, gis: list[int], every: bool) -> None:
    """Destroy GPU instances ``gis``; ``every`` when they are all the DCU has."""
    if every:
        # Compute instances first, then their GPU instances (the driver refuses otherwise).
        hy.run(["mig", "-dci", "-i", str(dcu.index)])
        hy.run(["mig", "-dgi", "-i", str(dcu.index)])
        return
    for gi in gis:
        hy.run(["mig", "-dci", "-gi", str(gi), "-i", str(dcu.index)])
        hy.run(["mig", "-dgi", "-gi", str(gi), "-i", str(dcu.index)])
