"""Shared by the inventory tests: a small fake backend whose fleet is plain dicts the test
edits, the records it is built from, and the fork context the racing processes use."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Sequence

from gpuflow.hardware.backend import (
    Backend,
    DeviceInfo,
    DeviceLostError,
    NodeInfo,
    Partition,
    PartitionRequest,
    TelemetrySample,
    UnsupportedError,
)

A100 = "NVIDIA A100-SXM4-40GB"
V100 = "Tesla V100-SXM2-32GB"
DCU = "Hygon DCU Z100"
MP = mp.get_context("fork")


def device_info(node: str, index: int, sku: str = A100, uuid: str | None = None) -> DeviceInfo:
    """One device of the fake fleet; its vendor and partition kinds follow its SKU."""
    vendor = "Hygon" if sku == DCU else "NVIDIA"
    kinds = {"A100": ("mig",), "Hygon": ("vdcu",)}
    return DeviceInfo(
        node=node,
        index=index,
        vendor=vendor,  # type: ignore[arg-type]
        sku=sku,
        uuid=uuid or f"GPU-{node}-{index}",
        memory_total_mb=32768 if sku in (V100, DCU) else 40960,
        pci_device_id="0x20B010DE" if sku == A100 else None,
        partition_kinds=kinds.get("A100" if sku == A100 else vendor, ()),  # type: ignore[arg-type]
    )


def mig_partition(node: str, index: int, uuid: str, profile: str, start: int) -> Partition:
    """A MIG partition of ``profile`` starting at slice ``start``."""
    size = {"3g.20gb": 4, "2g.10gb": 2, "1g.5gb": 1}[profile]
    return Partition(
        node=node,
        device_index=index,
        uuid=uuid,
        profile=profile,
        kind="mig",
        memory_mb=size * 5120,
        placement_start=start,
        placement_size=size,
    )


class FakeBackend(Backend):
    """Discovery and partitions from plain dicts the test edits; the rest is unsupported."""

    name = "fake"

    def __init__(self) -> None:
        self.nodes: dict[str, NodeInfo] = {
            "n1": NodeInfo("n1", "r1", "active", (device_info("n1", 0), device_info("n1", 1))),
            "n2": NodeInfo(
                "n2", "r2", "active", (device_info("n2", 0, V100), device_info("n2", 1, DCU))
            ),
            "spare1": NodeInfo("spare1", "r1", "spare", (device_info("spare1", 0),)),
        }
        self.parts: dict[tuple[str, int], list[Partition]] = {
            ("n1", 0): [
                mig_partition("n1", 0, "MIG-a", "3g.20gb", 4),
                mig_partition("n1", 0, "MIG-b", "2g.10gb", 0),
            ],
            ("n2", 1): [
                Partition(
                    node="n2",
                    device_index=1,
                    uuid="VDCU-n2-1-0",
                    profile="vdcu",
                    kind="vdcu",
                    memory_mb=8192,
                    compute_units=15,
                )
            ],
        }
        self.lost: set[tuple[str, int]] = set()

    def discover(self) -> list[NodeInfo]:
        return list(self.nodes.values())

    def partitions(self, node: str, index: int) -> list[Partition]:
        if (node, index) in self.lost:
            raise DeviceLostError(f"{node}:{index} fell off the bus")
        return list(self.parts.get((node, index), []))

    def telemetry(self, node: str, index: int) -> TelemetrySample:
        raise UnsupportedError("fake")

    def partition_profiles(self, node: str, index: int) -> list:  # type: ignore[type-arg]
        return []

    def partition_mode(self, node: str, index: int) -> bool:
        return bool(self.parts.get((node, index)))

    def set_partition_mode(self, node: str, index: int, enabled: bool) -> None:
        raise UnsupportedError("fake")

    def create_partitions(
        self, node: str, index: int, requests: Sequence[PartitionRequest]
    ) -> list[Partition]:
        raise UnsupportedError("fake")

    def destroy_partitions(self, node: str, index: int, uuids: Sequence[str] | None = None) -> None:
        raise UnsupportedError("fake")

    def clocks(self, node: str, index: int):  # type: ignore[no-untyped-def]
        raise UnsupportedError("fake")

    def set_locked_clocks(self, node: str, index: int, min_mhz: int, max_mhz: int) -> None:
        raise UnsupportedError("fake")

    def reset_locked_clocks(self, node: str, index: int) -> None:
        raise UnsupportedError("fake")

    def set_applications_clocks(
        self, node: str, index: int, mem_clock_mhz: int, sm_clock_mhz: int
    ) -> None:
        raise UnsupportedError("fake")

    def power_limits(self, node: str, index: int):  # type: ignore[no-untyped-def]
        raise UnsupportedError("fake")

    def set_power_limit_mw(self, node: str, index: int, limit_mw: int) -> None:
        raise UnsupportedError("fake")


def telemetry_sample(node: str, index: int, t: float, **kw: object) -> TelemetrySample:
    """A healthy reading of one device at ``t``; ``kw`` overrides any field."""
    base = dict(
        node=node,
        index=index,
        timestamp_s=t,
        present=True,
        temperature_c=55.0,
        power_mw=120_000,
        energy_mj=5_000_000,
        utilization_ratio=0.5,
        memory_used_mb=1000,
        memory_total_mb=40960,
        sm_clock_mhz=1410,
        power_limit_mw=400_000,
        clock_event_reasons=("SwPowerCap",),
        xids=(48,),
    )
    base.update(kw)
    return TelemetrySample(**base)  # type: ignore[arg-type]
