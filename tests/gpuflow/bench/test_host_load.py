"""Steal is read from /proc/stat per core, as the share of that core's time between two
readings; guest time (already inside user) is not counted twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuflow.bench.host_load import CpuTimes, cpu_report, load_report, steal_shares


def _stat(path: Path, rows: dict[str, list[int]]) -> Path:
    lines = [f"{name} {' '.join(str(v) for v in values)}" for name, values in rows.items()]
    path.write_text("\n".join([*lines, "intr 12345 0 0", "ctxt 999", "btime 1"]) + "\n")
    return path


def test_steal_share_per_core_and_for_the_machine(tmp_path: Path) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    first = {
        "cpu": [100, 0, 50, 800, 0, 0, 0, 50, 40, 0],
        "cpu0": [50, 0, 25, 400, 0, 0, 0, 25, 40, 0],
        "cpu1": [50, 0, 25, 400, 0, 0, 0, 25, 0, 0],
    }
    # cpu0: 100 more jiffies, 30 of them stolen (and 1000 of guest time, inside user);
    # cpu1: 100 more, none stolen
    ticks = {"cpu0": [40, 0, 0, 30, 0, 0, 0, 30, 1000, 0], "cpu1": [30, 0, 0, 70, 0, 0, 0, 0, 0, 0]}
    ticks["cpu"] = [a + b for a, b in zip(ticks["cpu0"], ticks["cpu1"], strict=True)]
    second = {
        name: [a + b for a, b in zip(first[name], ticks[name], strict=True)] for name in first
    }
    before = CpuTimes.now(_stat(tmp_path / "a", first))
    after = CpuTimes.now(_stat(tmp_path / "b", second))
    shares = steal_shares(before, after, [0, 1, 7])  # core 7 is not listed: left out
    assert shares == {"all": pytest.approx(30 / 200), "0": 0.3, "1": 0.0}
    report = load_report(before, after, [0, 1])
    assert report["steal_share"] == pytest.approx(0.15)
    assert report["steal_share_max_pinned_core"] == pytest.approx(0.3)
    assert report["load_avg_1m_after"] >= 0


def test_no_proc_stat_reports_load_only(tmp_path: Path) -> None:
    missing = CpuTimes.now(tmp_path / "missing")
    assert missing.cores == {}
    assert set(load_report(missing, missing, [0])) == {"load_avg_1m_after"}


def test_this_machine_reads(tmp_path: Path) -> None:
    now = CpuTimes.now()
    assert "all" in now.cores and now.cores["all"][1] > 0


def test_the_cpu_and_its_idle_driver_are_reported_where_linux_says(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu\n")
    idle = tmp_path / "cpuidle"
    idle.mkdir()
    (idle / "current_driver").write_text("haltpoll\n")
    (idle / "current_governor").write_text("haltpoll\n")
    poll = tmp_path / "guest_halt_poll_ns"
    poll.write_text("0\n")
    assert cpu_report(info, idle, poll) == {
        "cpu_model": "AMD EPYC 7B13",
        "cpuidle_driver": "haltpoll",
        "cpuidle_governor": "haltpoll",
        "guest_halt_poll_ns": "0",
    }
    # an older kernel names its governor's file current_governor_ro
    (idle / "current_governor").rename(idle / "current_governor_ro")
    assert cpu_report(info, idle, poll)["cpuidle_governor"] == "haltpoll"
    (idle / "current_governor_ro").unlink()
    assert "cpuidle_governor" not in cpu_report(info, idle, poll)
    none = tmp_path / "none"
    assert cpu_report(none, none, none) == {}
