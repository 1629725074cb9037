"""Does a layout fit a device? MIG placement search and vDCU budgets.

Placement is a search, not a greedy fill: on an A100-40GB, 3g.20gb + 2g.10gb + 2x1g.5gb
fits only with the 3g instance at memory slice 4, which a left-to-right fill never finds.
The search is exact (backtracking over the SKU's placement table, largest first), and the
device's tables are small (8 memory slices), so it is also fast.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gpuflow.hardware.backend import InvalidRequestError, PartitionProfile, PartitionRequest

MIG_COMPUTE_SLICES = 7
MIG_MEMORY_SLICES = 8


class LayoutError(InvalidRequestError):
    """A layout that cannot exist on a device. ``rule`` names the rule it breaks."""

    def __init__(self, device: str, rule: str, detail: str) -> None:
        self.device = device
        self.rule = rule
        super().__init__(f"{device}: {rule}: {detail}")


@dataclass(frozen=True)
class Occupied:
    """A MIG instance that already exists: memory slices [start, start+size), compute."""

    start: int
    size: int
    compute_slices: int


def _profile(profiles: Sequence[PartitionProfile], name: str, device: str) -> PartitionProfile:
    for p in profiles:
        if p.name == name:
            return p
    known = ", ".join(p.name for p in profiles) or "none"
    raise LayoutError(
        device, "unknown-profile", f"profile {name!r} is not offered (offered: {known})"
    )


def fit_mig(
    device: str,
    profiles: Sequence[PartitionProfile],
    requests: Sequence[PartitionRequest],
    existing: Sequence[Occupied] = (),
    existing_counts: Counter[str] | None = None,
) -> list[PartitionRequest]:
    """Return ``requests`` with a placement_start each, or raise LayoutError.

    A request that already names a placement keeps it (it must be legal and free).
    """
    mig = [p for p in profiles if p.kind == "mig"]
    if not mig:
        raise LayoutError(device, "no-mig", "this device does not support MIG")
    wanted = [_profile(mig, r.profile, device) for r in requests]
    counts = Counter(p.name for p in wanted) + (existing_counts or Counter())
    for p in mig:
        if counts[p.name] > p.max_count:
            raise LayoutError(
                device,
                "max-count",
                f"{counts[p.name]} x {p.name} requested, at most {p.max_count} per device",
            )
    compute = sum(p.compute_slices for p in wanted) + sum(o.compute_slices for o in existing)
    if compute > MIG_COMPUTE_SLICES:
        raise LayoutError(
            device,
            "compute-slices",
            f"layout needs {compute} compute slices, the device has {MIG_COMPUTE_SLICES}",
        )
    memory = sum(p.placement_size for p in wanted) + sum(o.size for o in existing)
    if memory > MIG_MEMORY_SLICES:
        raise LayoutError(
            device,
            "memory-slices",
            f"layout needs {memory} memory slices, the device has {MIG_MEMORY_SLICES}",
        )
    used = [False] * MIG_MEMORY_SLICES
    for o in existing:
        for s in range(o.start, o.start + o.size):
            used[s] = True

    def free(start: int, size: int) -> bool:
        return start + size <= MIG_MEMORY_SLICES and not any(used[start : start + size])

    def mark(start: int, size: int, value: bool) -> None:
        for s in range(start, start + size):
            used[s] = value

    starts: list[int | None] = [r.placement_start for r in requests]
    for i, (r, p) in enumerate(zip(requests, wanted, strict=True)):
        if r.placement_start is None:
            continue
        if r.placement_start not in p.placement_starts or not free(
            r.placement_start, p.placement_size
        ):
            raise LayoutError(
                device,
                "placement",
                f"{p.name} cannot start at memory slice {r.placement_start} "
                f"(legal starts {list(p.placement_starts)}, or the slices are taken)",
            )
        mark(r.placement_start, p.placement_size, True)
        starts[i] = r.placement_start

    # Largest first: big instances have the fewest legal starts, so they prune most.
    order = sorted(
        (i for i in range(len(requests)) if starts[i] is None),
        key=lambda i: (-wanted[i].placement_size, -wanted[i].compute_slices, i),
    )

    def search(k: int) -> bool:
        if k == len(order):
            return True
        i = order[k]
        p = wanted[i]
        for start in p.placement_starts:
            if free(start, p.placement_size):
                mark(start, p.placement_size, True)
                starts[i] = start
                if search(k + 1):
                    return True
                mark(start, p.placement_size, False)
                starts[i] = None
        return False

    if not search(0):
        names = ", ".join(r.profile for r in requests)
        raise LayoutError(device, "placement", f"no placement fits all of [{names}] on this device")
    return [
        PartitionRequest(profile=r.profile, placement_start=s)
        for r, s in zip(requests, starts, strict=True)
    ]


def fit_vdcu(
    device: str,
    max_count: int,
    compute_units_total: int,
    memory_total_mb: int,
    requests: Sequence[PartitionRequest],
) -> list[PartitionRequest]:
    """Check virtual DCUs against the device's count, compute-unit and memory budgets."""
    if max_count <= 0:
        raise LayoutError(device, "no-vdcu", "this device does not support virtual DCUs")
    if len(requests) > max_count:
        raise LayoutError(
            device, "max-count", f"{len(requests)} vDCUs requested, at most {max_count} per DCU"
        )
    for r in requests:
        if r.profile != "vdcu":
            raise LayoutError(device, "unknown-profile", f"profile {r.profile!r} is not a vDCU")
        if r.compute_units is None or r.compute_units < 1:
            raise LayoutError(
                device, "compute-units", f"a vDCU needs >= 1 compute unit, got {r.compute_units}"
            )
        if r.memory_mb is None or r.memory_mb < 1:
            raise LayoutError(
                device, "memory", f"a vDCU needs >= 1 MiB of memory, got {r.memory_mb}"
            )
    cus = sum(r.compute_units or 0 for r in requests)
    if cus > compute_units_total:
        raise LayoutError(
            device,
            "compute-units",
            f"vDCUs need {cus} compute units, the DCU has {compute_units_total}",
        )
    mem = sum(r.memory_mb or 0 for r in requests)
    if mem > memory_total_mb:
        raise LayoutError(
            device, "memory", f"vDCUs need {mem} MiB, the DCU has {memory_total_mb} MiB"
        )
    return list(requests)
