"""Power-limit sweeps measured by Zeus (NSDI'23): one CSV per GPU, read into plain tuples.

Each row of ``summary_power_<gpu>.csv`` (../shared/data/zeus-traces, Apache-2.0, from
github.com/ml-energy/zeus) is one workload - (dataset, network, batch_size, optimizer) -
run for an epoch at one power limit: ``power_limit`` (W), ``time_per_epoch`` (s),
``average_power`` (W). Energy per epoch is their product. Plain Python, no Prefect.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

# The four summary_power_*.csv of ../shared/data/zeus-traces, copied into the package with
# their source and license (data/zeus_traces/README.md), so a wheel and a bare clone have them.
DEFAULT_TRACES_DIR = Path(__file__).resolve().parent / "data" / "zeus_traces"

COLUMNS = (
    "dataset",
    "network",
    "batch_size",
    "optimizer",
    "power_limit",
    "time_per_epoch",
    "average_power",
)


@dataclass(frozen=True, order=True)
class Workload:
    """One traced workload: what was trained, how (batch size, optimizer)."""

    dataset: str
    network: str
    batch_size: int
    optimizer: str

    @property
    def name(self) -> str:
        return f"{self.dataset}/{self.network}/{self.batch_size}/{self.optimizer}"


class TracePoint(NamedTuple):
    """One epoch at one power limit."""

    power_limit_w: float
    time_per_epoch_s: float
    average_power_w: float

    @property
    def energy_j(self) -> float:
        return self.time_per_epoch_s * self.average_power_w


def read_trace(path: str | Path) -> dict[Workload, list[TracePoint]]:
    """Every workload of a Zeus power trace with its points, sorted by power limit.

    Raises ValueError naming the file and line for a missing column, a value that is not a
    positive number, or a workload measured twice at one limit.
    """
    path = Path(path)
    out: dict[Workload, list[TracePoint]] = {}
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing}; expected {list(COLUMNS)}")
        for line, row in enumerate(reader, start=2):
            try:
                w = Workload(
                    row["dataset"], row["network"], int(row["batch_size"]), row["optimizer"]
                )
                p = TracePoint(
                    float(row["power_limit"]),
                    float(row["time_per_epoch"]),
                    float(row["average_power"]),
                )
            except (TypeError, ValueError):
                raise ValueError(f"{path}:{line}: not a valid trace row: {row}") from None
            if not all(math.isfinite(v) and v > 0 for v in p):
                raise ValueError(f"{path}:{line}: values must be positive numbers, got {p}")
            points = out.setdefault(w, [])
            if any(q.power_limit_w == p.power_limit_w for q in points):
                raise ValueError(f"{path}:{line}: {w.name} measured twice at {p.power_limit_w:g} W")
            points.append(p)
    for points in out.values():
        points.sort()
    return dict(sorted(out.items()))
