"""What the telemetry exporter's tests share: the twin's clock held still, an exporter on
the twin that only refreshes when the test says so, and a scrape over real HTTP read back
with prometheus_client's own text parser."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from gpuflow.hardware.backend import Backend
from gpuflow.hardware.sim import clock as simclock
from gpuflow.tasks.health.baselines import RuleModel
from gpuflow.tasks.health.features import WINDOW_BUCKETS
from gpuflow.tasks.telemetry.exporter import TelemetryExporter
from gpuflow.tasks.telemetry.snapshot import SnapshotBuilder
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def freeze_twin_clock(monkeypatch: pytest.MonkeyPatch, at_s: float) -> None:
    """Sim time stands still at ``at_s``: two readers of the twin (the exporter and
    `gpuflow hw list`) see one and the same moment, whenever each reads."""
    monkeypatch.setattr(simclock, "time", SimpleNamespace(time=lambda: at_s))


def until_stopped(stop: threading.Event, _seconds: float) -> bool:
    """A sampler pause that never ends by itself: refreshes come from the test only."""
    return stop.wait()


@contextmanager
def serving(
    backend: Backend, inventory: Any | None = None, wait: Any = until_stopped, **builder: Any
) -> Iterator[TelemetryExporter]:
    """An exporter of ``backend`` on 127.0.0.1 (a free port), health from the rules."""
    builder.setdefault("model", RuleModel(WINDOW_BUCKETS))
    builder.setdefault("model_source", "rules")
    exporter = TelemetryExporter(
        SnapshotBuilder(backend, inventory=inventory, **builder), 5.0, wait=wait
    )
    exporter.start("127.0.0.1", 0)
    try:
        yield exporter
    finally:
        exporter.stop()


class Scrape:
    """One /metrics body, parsed; samples are looked up by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples: list[Sample] = [s for f in self.families.values() for s in f.samples]

    def find(self, name: str, **labels: str) -> list[Sample]:
        """Samples called ``name`` whose labels include ``labels``; ``GPU_I_ID=""`` asks for
        device-level samples only (no GPU instance labels)."""
        out = []
        for s in self.samples:
            if s.name != name:
                continue
            if all(s.labels.get(k, "") == v for k, v in labels.items()):
                out.append(s)
        return out

    def value(self, name: str, **labels: str) -> float:
        found = self.find(name, **labels)
        assert len(found) == 1, f"{name}{labels}: {len(found)} samples: {found}"
        return found[0].value

    def names(self) -> set[str]:
        return {s.name for s in self.samples}


def busy_fleet(twin: Any, inventory: Any) -> None:
    """The default twin with one of everything the exporter can show: a MIG instance
    (a100-0:0), a lease (v100-0:0) and a cordon (v100-0:1), an XID (a100-0:1) and
    applications clocks (a100-0:2)."""
    from gpuflow.hardware.backend import PartitionRequest

    twin.set_partition_mode("a100-0", 0, True)
    twin.create_partitions("a100-0", 0, [PartitionRequest("3g.20gb")])
    inventory.sync(twin)
    inventory.cordon("v100-0", 1, reason="fan noise")
    inventory.acquire_lease(twin.device("v100-0", 0).uuid, "job-whole", 3600)
    twin.inject_fault("a100-0", 1, "app-fatal")
    twin.set_applications_clocks("a100-0", 2, 1215, 1095)  # the A100's memory clock [D]


def scrape(url: str) -> Scrape:
    with urllib.request.urlopen(url, timeout=30) as resp:  # noqa: S310 - our loopback server
        assert resp.status == 200
        return Scrape(resp.read().decode())
