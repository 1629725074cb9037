"""Reading the Zeus power-limit sweeps (tasks/energy/traces.py)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from gpuflow.tasks.energy.traces import COLUMNS, TracePoint, Workload, read_trace

from tests.helpers.traces import V100

HEADER = ",".join(COLUMNS)

pytestmark = pytest.mark.skipif(not V100.exists(), reason=f"no Zeus trace at {V100}")


def test_the_v100_trace_has_68_workloads_at_7_limits_each_sorted() -> None:
    trace = read_trace(V100)
    assert len(trace) == 68
    assert list(trace) == sorted(trace)
    for points in trace.values():
        assert [p.power_limit_w for p in points] == [100, 125, 150, 175, 200, 225, 250]
    with V100.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert sum(len(p) for p in trace.values()) == len(rows) == 68 * 7
    # Each row lands on its workload and limit, unchanged.
    for row in rows[:: len(rows) // 20]:
        w = Workload(row["dataset"], row["network"], int(row["batch_size"]), row["optimizer"])
        (p,) = [q for q in trace[w] if q.power_limit_w == float(row["power_limit"])]
        assert p.time_per_epoch_s == float(row["time_per_epoch"])
        assert p.average_power_w == float(row["average_power"])
        assert p.energy_j == pytest.approx(p.time_per_epoch_s * p.average_power_w)


def test_workload_names_and_points() -> None:
    w = Workload("cifar100", "shufflenetv2", 1024, "adam")
    assert w.name == "cifar100/shufflenetv2/1024/adam"
    assert TracePoint(100.0, 10.0, 80.0).energy_j == 800.0


def _write(tmp_path: Path, *lines: str, header: str = HEADER) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text("\n".join([header, *lines]) + "\n", encoding="utf-8")
    return path


GOOD = "cifar100,resnet50,64,adam,100,20.0,95.0"


def test_a_small_good_file_reads(tmp_path: Path) -> None:
    path = _write(tmp_path, "cifar100,resnet50,64,adam,150,15.0,140.0", GOOD)
    ((w, points),) = read_trace(path).items()
    assert w == Workload("cifar100", "resnet50", 64, "adam")
    assert points == [TracePoint(100.0, 20.0, 95.0), TracePoint(150.0, 15.0, 140.0)]


def test_a_missing_column_names_the_file_and_the_column(tmp_path: Path) -> None:
    header = HEADER.replace(",average_power", "")
    path = _write(tmp_path, "cifar100,resnet50,64,adam,100,20.0", header=header)
    with pytest.raises(ValueError, match=re.escape(str(path)) + r".*average_power"):
        read_trace(path)


@pytest.mark.parametrize(
    "bad",
    [
        "cifar100,resnet50,64,adam,150,0,140.0",
        "cifar100,resnet50,64,adam,150,15.0,-3",
        "cifar100,resnet50,64,adam,150,nan,140.0",
        "cifar100,resnet50,64,adam,150,fast,140.0",
        "cifar100,resnet50,sixty,adam,150,15.0,140.0",
        "cifar100,resnet50,64,adam,150,15.0",
    ],
)
def test_a_bad_value_names_the_file_and_line(tmp_path: Path, bad: str) -> None:
    path = _write(tmp_path, GOOD, bad)
    with pytest.raises(ValueError, match=re.escape(f"{path}:3:")):
        read_trace(path)


def test_a_limit_measured_twice_names_the_file_line_and_workload(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD, "cifar100,resnet50,32,adam,100,30.0,90.0", GOOD)
    with pytest.raises(
        ValueError, match=re.escape(f"{path}:4: cifar100/resnet50/64/adam measured twice at 100 W")
    ):
        read_trace(path)
