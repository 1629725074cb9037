"""The prometheus_client side: a Collector that serves the exporter's last snapshot.

A scrape calls ``collect`` on the HTTP server's thread; it reads the snapshot the sampler
thread left and the exporter's own counters, so it costs microseconds and never waits on
a device, hy-smi or the twin's state lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from gpuflow.tasks.telemetry.snapshot import Family
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector


def to_metric(family: Family) -> Metric:
    """A prometheus_client family. Built from ``Metric`` itself because one family's
    samples carry different label sets (a GPU and its MIG instances in
    DCGM_FI_DEV_FB_TOTAL), which the *MetricFamily helpers' fixed label names cannot."""
    metric = Metric(family.name, family.help, family.kind)
    # A counter's samples are <name>_total in both exposition formats.
    sample_name = family.name + "_total" if family.kind == "counter" else family.name
    for labels, value in family.samples:
        metric.add_sample(sample_name, labels, value)
    return metric


class SnapshotCollector(Collector):
    """Yields ``families()``: the snapshot's families, then the exporter's own."""

    def __init__(self, families: Callable[[], Sequence[Family]]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        for family in self._families():
            yield to_metric(family)

    def describe(self) -> list[Metric]:
        # Which families exist depends on the fleet; registering must not collect.
        return []


__all__ = ["SnapshotCollector", "to_metric"]
