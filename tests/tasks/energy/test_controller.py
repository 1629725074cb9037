"""The DVFS controller (tasks/energy/controller.py) on the twin, ticks driven by the test:
the twin's clock is fast-forwarded one sampling interval per tick and a stand-in job
(tests/helpers/dvfs_job.py) progresses at the rate the device's power limit allows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Inventory
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.energy.controller import DvfsController, TickReport, run_controller
from gpuflow.tasks.energy.optimizer import Objective
from gpuflow.tasks.energy.settings import DeviceSettings

from tests.helpers.dvfs_job import TwinJob, a100_twin

N = "a100-0"  # A100 40GB: 100..400 W, default 400 W: 13 settings 25 W apart
INTERVAL_S = 5.0
HOLDER = "dvfs:test"


@pytest.fixture
def twin(tmp_path: Path) -> SimBackend:
    return a100_twin(tmp_path, "dvfs", 5, 2)


@pytest.fixture
def inv(tmp_path: Path, twin: SimBackend) -> Iterator[Inventory]:
    # The twin's clock for leases, settings holds and progress: one time line for all.
    inventory = Inventory(f"sqlite:///{tmp_path / 'inv.db'}", now=twin.now_s)
    inventory.sync(twin)
    yield inventory
    inventory.close()


def controller(twin: SimBackend, inv: Inventory, **kw: object) -> DvfsController:
    """A controller on the twin; no warm-up unless asked (its own test has one)."""
    settings = DeviceSettings(twin, inv, HOLDER, ttl_s=kw.pop("ttl_s", 60.0))  # type: ignore[arg-type]
    kw.setdefault("warmup_s", 0.0)
    return DvfsController(
        twin,
        inv,
        settings,
        Objective(slowdown=0.10),
        clock=twin.now_s,
        **kw,  # type: ignore[arg-type]
    )


def limit_w(twin: SimBackend, index: int = 0) -> float:
    return twin.power_limits(N, index).limit_mw / 1000.0


def interval(ctl: DvfsController, *jobs: TwinJob, slow: float = 1.0) -> TickReport:
    """One sampling interval: the jobs work it at the current limits, then a tick."""
    for job in jobs:
        job.run(INTERVAL_S, slow=slow)
    return ctl.tick()


def until_decided(ctl: DvfsController, *jobs: TwinJob, limit: int = 40) -> list[TickReport]:
    reports = []
    for _ in range(limit):
        reports.append(interval(ctl, *jobs))
        if reports[-1].decisions:
            return reports
    raise AssertionError(f"no decision after {limit} intervals: {reports[-1].events}")


def test_it_probes_fewer_settings_than_exist_and_keeps_the_slowdown_bound(
    twin: SimBackend, inv: Inventory
) -> None:
    job = TwinJob(twin, inv, "job-1", N, 0)
    ctl = controller(twin, inv)
    first = ctl.tick()
    assert first.actions(N, 0) == ["probe"] and first.of(N, 0)[0].setting_w == 400.0
    reports = until_decided(ctl, job)
    [decision] = reports[-1].decisions
    choice = decision.choice
    assert (decision.job_id, decision.reason) == ("job-1", "new job")
    assert choice.reference.setting == 400.0
    assert 2 <= len(choice.probes) < 13  # fewer probes than the device has settings
    # The bound holds on what it measured, and the device's own pace agrees.
    assert choice.chosen.time_s <= 1.10 * choice.reference.time_s
    assert choice.chosen.setting < 400.0 and choice.energy_saving > 0.03
    assert limit_w(twin) == choice.chosen.setting
    assert job.step_s() <= 1.10 * job.base_step_s * 1.01
    # The reference is measured over three intervals back to back (its noise guards the
    # comparisons); each later probe settles one interval and measures the next.
    actions = [a for r in reports for a in r.actions(N, 0)]
    assert actions[:5] == ["measuring", "measured", "measured", "measured", "probe"]
    assert actions[5:8] == ["measuring", "measured", "probe"]
    [row] = inv.settings()
    assert (row.holder, row.power_limit_mw, row.original_power_limit_mw) == (
        HOLDER,
        int(choice.chosen.setting * 1000),
        400_000,
    )


def test_a_reference_read_during_warm_up_does_not_let_a_too_slow_limit_through(
    twin: SimBackend, inv: Inventory
) -> None:
    # The job runs 5 % slower while the reference is measured (its warm-up), then at its
    # pace: against the slow reference 300 W, 11 % slower than 400 W at the job's real
    # pace, reads within 10 % and was chosen. The highest setting measured again after the
    # last probe gives it away.
    job = TwinJob(twin, inv, "job-1", N, 0)
    ctl = controller(twin, inv)
    ctl.tick()
    warm = [interval(ctl, job, slow=1.05) for _ in range(4)]  # settle + 3 reference windows
    assert [a for r in warm for a in r.actions(N, 0)][-2:] == ["measured", "probe"]
    reports = until_decided(ctl, job)
    actions = [a for r in reports for a in r.actions(N, 0)]
    closing = [e for r in reports for e in r.of(N, 0) if e.detail == "closing reference"]
    assert len(closing) == 1 and closing[0].setting_w == 400.0
    assert actions[-3:] == ["measuring", "measured", "chosen"]
    [decision] = reports[-1].decisions
    choice = decision.choice
    assert choice.closing is not None and choice.reference is choice.closing
    assert choice.closing.time_s < choice.probes[0].time_s / 1.04  # the warm-up, seen
    # The bound holds at the job's real pace, not just against the warm-up's.
    assert job.step_s() <= 1.10 * job.base_step_s * 1.01
    assert choice.chosen.time_s <= 1.10 * choice.closing.time_s


def test_a_new_job_warms_up_at_the_highest_setting_before_it_is_measured(
    twin: SimBackend, inv: Inventory
) -> None:
    job = TwinJob(twin, inv, "job-1", N, 0)
    ctl = controller(twin, inv, warmup_s=12.0)
    assert ctl.tick().actions(N, 0) == ["probe"] and limit_w(twin) == 400.0
    # Job time 5 s and 10 s: warming up, nothing measured, the limit untouched.
    for left in ("7", "2"):
        report = interval(ctl, job)
        assert [(e.action, e.detail) for e in report.of(N, 0)] == [
            ("waiting", f"warm-up, {left} s left")
        ]
    assert interval(ctl, job).actions(N, 0) == ["measuring"]  # 15 s: the window opens
    # A search after a drift does not wait again: the job is warm by then.
    [decision] = until_decided(ctl, job)[-1].decisions
    assert decision.reason == "new job" and limit_w(twin) == decision.choice.chosen.setting
    interval(ctl, job)
    job.base_step_s *= 1.4
    actions = [a for _ in range(3) for a in interval(ctl, job).actions(N, 0)]
    assert actions[-2:] == ["redecide", "probe"]
    assert interval(ctl, job).actions(N, 0) == ["measuring"]


def test_a_pinned_device_and_one_without_progress_are_left_alone(
    twin: SimBackend, inv: Inventory
) -> None:
    pinned = TwinJob(twin, inv, "job-pins", N, 1)
    DeviceSettings(twin, inv, "job-pins", ttl_s=600).apply_power_limit(N, 1, 250_000)
    quiet = TwinJob(twin, inv, "job-quiet", N, 0, publish=False)
    ctl = controller(twin, inv)
    for _ in range(4):
        report = interval(ctl, pinned, quiet)
        why = report.why_left_alone()
        assert "'job-pins'" in why[f"{N}:1"] and "left alone" in why[f"{N}:1"]
        assert why[f"{N}:0"] == "its job publishes no progress"
    assert (limit_w(twin, 1), limit_w(twin, 0)) == (250.0, 400.0)
    assert [(r.index, r.holder) for r in inv.settings()] == [(1, "job-pins")]
    assert ctl.stop() == [] and limit_w(twin, 1) == 250.0  # not ours to put back


def test_one_noisy_interval_does_not_redecide_but_n_drifted_ones_do(
    twin: SimBackend, inv: Inventory
) -> None:
    job = TwinJob(twin, inv, "job-1", N, 0)
    ctl = controller(twin, inv, hysteresis=0.10, drift_intervals=3)
    ctl.tick()
    [decision] = until_decided(ctl, job)[-1].decisions
    chosen = decision.choice.chosen.setting
    interval(ctl, job)  # the choice settles (or is measured at once)
    for _ in range(2):
        assert interval(ctl, job).actions(N, 0) == ["watch"]
    noisy = interval(ctl, job, slow=1.5)  # one slow interval: a drift, not a decision
    assert noisy.actions(N, 0) == ["watch"] and "drifted 1/3" in noisy.of(N, 0)[0].detail
    calm = interval(ctl, job)
    assert "drifted 0/3" in calm.of(N, 0)[0].detail and limit_w(twin) == chosen
    # The workload changes for good: its steps take 40 % longer at every clock.
    job.base_step_s *= 1.4
    assert "drifted 1/3" in interval(ctl, job).of(N, 0)[0].detail
    assert "drifted 2/3" in interval(ctl, job).of(N, 0)[0].detail
    third = interval(ctl, job)
    assert third.actions(N, 0) == ["watch", "redecide", "probe"]
    assert limit_w(twin) == 400.0  # a new search starts from the highest setting
    [again] = until_decided(ctl, job)[-1].decisions
    assert again.reason == "drift" and len(ctl.decisions) == 2


def test_it_restores_when_the_job_ends_and_everything_on_stop(
    twin: SimBackend, inv: Inventory
) -> None:
    a, b = TwinJob(twin, inv, "job-a", N, 0), TwinJob(twin, inv, "job-b", N, 1)
    ctl = controller(twin, inv)
    ctl.tick()
    until_decided(ctl, a, b)
    for _ in range(3):
        interval(ctl, a, b)
    assert limit_w(twin, 0) < 400.0 and limit_w(twin, 1) < 400.0
    a.end()
    report = interval(ctl, b)
    assert report.actions(N, 0) == ["restored"] and "its job ended" in report.of(N, 0)[0].detail
    assert limit_w(twin, 0) == 400.0 and [r.index for r in inv.settings()] == [1]
    # A new job on the freed device: a search of its own, from the highest setting.
    c = TwinJob(twin, inv, "job-c", N, 0)
    assert interval(ctl, b, c).actions(N, 0) == ["probe"]
    outcomes = ctl.stop()
    assert sorted(o["device"] for o in outcomes) == [f"{N}:0", f"{N}:1"]
    assert (limit_w(twin, 0), limit_w(twin, 1)) == (400.0, 400.0) and inv.settings() == []
    totals = {t.job_id: t.to_dict() for t in ctl.totals}
    assert totals["job-a"]["energy_j"] > 0 and totals["job-a"]["chosen_power_limit_w"] < 400
    assert 0 < totals["job-b"]["time_per_unit_s"] < 0.2


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"interval_s": 4.9}, "interval_s 4.9 s is below 5 s"),
        ({"interval_s": "5"}, "interval_s must be a number"),
        ({"ttl_s": 10.0}, "must outlast two sampling intervals"),
        ({"drift_intervals": 0}, "drift_intervals must be >= 1"),
        ({"hysteresis": -0.1}, "hysteresis must be >= 0"),
        ({"warmup_s": -1.0}, "warmup_s must be >= 0"),
    ],
)
def test_bad_parameters_are_refused_before_anything_changes(
    twin: SimBackend,
    inv: Inventory,
    kw: dict,
    message: str,  # type: ignore[type-arg]
) -> None:
    TwinJob(twin, inv, "job-1", N, 0)
    with pytest.raises(InvalidRequestError, match=message):
        controller(twin, inv, **kw)
    assert inv.settings() == [] and limit_w(twin) == 400.0


def test_run_controller_cleans_up_a_predecessor_first_and_restores_at_the_end(
    twin: SimBackend, inv: Inventory
) -> None:
    # A killed predecessor's change on :1, its hold long lapsed.
    DeviceSettings(twin, inv, "dvfs:dead", ttl_s=10).apply_power_limit(N, 1, 150_000)
    twin.advance(11)
    job = TwinJob(twin, inv, "job-1", N, 0)
    seen: list[TickReport] = []
    run = run_controller(
        twin,
        inv,
        objective=Objective(slowdown=0.10),
        interval_s=INTERVAL_S,
        duration_s=150.0,
        holder="dvfs:run-2",
        wait=job.run,  # the job works the interval instead of a sleep
        on_tick=seen.append,
    )
    assert [(c["node"], c["index"], c["status"], c["holder"]) for c in run.cleaned] == [
        (N, 1, "restored", "dvfs:dead")
    ]
    assert run.ticks == len(seen) >= 25 and run.decisions
    assert run.decisions[0].choice.chosen.setting < 400.0
    [total] = [t.to_dict() for t in run.totals]
    assert total["energy_j"] > 0 and total["chosen_power_limit_w"] < 400.0
    assert [(r["device"], r["status"]) for r in run.restored] == [(f"{N}:0", "restored")]
    assert (limit_w(twin, 0), limit_w(twin, 1)) == (400.0, 400.0) and inv.settings() == []
    assert run.to_dict()["decisions"][0]["device"] == f"{N}:0"


def test_run_controller_restores_when_a_tick_raises(twin: SimBackend, inv: Inventory) -> None:
    job = TwinJob(twin, inv, "job-1", N, 0)
    calls = []

    def wait(seconds: float) -> None:
        job.run(seconds)
        calls.append(seconds)
        if len(calls) == 4:
            raise KeyboardInterrupt  # a cancel arrives mid-run

    with pytest.raises(KeyboardInterrupt):
        run_controller(twin, inv, duration_s=600.0, holder="dvfs:cancelled", wait=wait)
    assert limit_w(twin) == 400.0 and inv.settings() == []
