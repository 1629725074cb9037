"""Virtual DCUs (``hy-smi virtual``): the budget, listing, creating a set, destroying all.

A DCU's vDCUs are created as one set in one ``-create-vdevices`` call, and only on a DCU
that has none: Yunion's cloudpods calls ``-create-vdevices 1`` repeatedly on one DCU,
which suggests some drivers append, but no vendor document says so; refusing is the safe
reading. hy-smi destroys every vDCU of a DCU at once; there is no per-vDCU destroy.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuflow.hardware.backend import (
    HardwareError,
    InvalidRequestError,
    Partition,
    PartitionProfile,
    PartitionRequest,
    UnsupportedError,
)
from gpuflow.hardware.hygon import parse as hp
from gpuflow.hardware.hygon.command import HySmi, is_int
from gpuflow.hardware.hygon.inventory import Dcu
from gpuflow.hardware.placement import fit_vdcu

VDCU_MAX_COUNT = 4
VDCU_PREFIX = "vdcu-"


def vdcu_profile(dcu: Dcu) -> PartitionProfile:
    """The one "vdcu" profile: any split of the DCU's compute units and memory."""
    return PartitionProfile(
        name="vdcu",
        kind="vdcu",
        profile_id=0,
        compute_slices=dcu.compute_units,
        memory_mb=dcu.vdcu_memory_mb,
        max_count=VDCU_MAX_COUNT,
    )


def list_vdcus(hy: HySmi, node_name: str, dcu: Dcu) -> list[Partition]:
    """The vDCUs of ``dcu``; their numbers are host-wide, so the uuid is ``vdcu-<n>``."""
    what = "hy-smi virtual -show-vdevice-info"
    proc = hy.run(["virtual", "-show-vdevice-info"])
    return [
        Partition(
            node=node_name,
            device_index=v.actual_device,
            uuid=f"{VDCU_PREFIX}{v.index}",
            profile="vdcu",
            kind="vdcu",
            memory_mb=v.memory_mb,
            compute_units=v.compute_units,
        )
        for v in hp.parse_virtual_info(proc.stdout, virtual=True, what=what)
        if v.actual_device == dcu.index
    ]


def check_requests(
    label: str, dcu: Dcu, reqs: list[PartitionRequest], notes: Sequence[str]
) -> None:
    """Everything static about a vDCU set: types, then the budget (runs no command)."""
    if "vdcu" not in dcu.kinds:
        raise UnsupportedError(
            f"{label} offers no vDCUs through `hy-smi virtual` ({'; '.join(notes)})"
        )
    for i, r in enumerate(reqs):
        for name, value in (("compute_units", r.compute_units), ("memory_mb", r.memory_mb)):
            if value is not None and not is_int(value):
                raise InvalidRequestError(f"vDCU request {i}: {name} must be an int, got {value!r}")
        if r.placement_start is not None:
            raise InvalidRequestError(f"vDCU request {i}: placement_start applies to MIG only")
    fit_vdcu(label, VDCU_MAX_COUNT, dcu.compute_units, dcu.vdcu_memory_mb, reqs)


def create(
    hy: HySmi,
    node_name: str,
    label: str,
    dcu: Dcu,
    reqs: list[PartitionRequest],
    existing: list[Partition],
) -> list[Partition]:
    """Create checked ``reqs`` as one set on a DCU whose partitions are ``existing``."""
    if existing:
        raise InvalidRequestError(
            f"{label} already has partitions {[p.uuid for p in existing]}; gpuflow "
            "creates a DCU's vDCUs as one set, so destroy them first (hy-smi destroys per DCU)"
        )
    cus = ",".join(str(r.compute_units) for r in reqs)
    mems = ",".join(str(r.memory_mb) for r in reqs)
    proc = hy.run(
        [
            "virtual",
            "-create-vdevices",
            str(len(reqs)),
            "-d",
            str(dcu.index),
            "-vdevice-compute-units",
            cus,
            "-vdevice-memory-size",
            mems,
        ]
    )
    # Trust the listing, not the message: some tools print errors and exit 0.
    created = sorted(
        list_vdcus(hy, node_name, dcu), key=lambda p: int(p.uuid.removeprefix(VDCU_PREFIX))
    )
    want = sorted((r.compute_units or 0, r.memory_mb or 0) for r in reqs)
    got = sorted((p.compute_units or 0, p.memory_mb) for p in created)
    if got != want:
        raise HardwareError(
            f"hy-smi virtual -create-vdevices on DCU {dcu.index} answered {hp.quote(proc.stdout)} "
            f"but the DCU now lists vDCUs (CUs, MiB) {got}, not the requested {want}"
        )
    return created


def destroy_all(hy: HySmi, dcu: Dcu) -> None:
    hy.run(["virtual", "-d", str(dcu.index), "-destroy-vdevice"])
