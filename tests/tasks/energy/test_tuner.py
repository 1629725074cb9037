"""InTrainingTuner on the twin's V100, driven step by step on sim time: a step takes
``base_s`` of host work plus what the device's clock adds (Backend.device_delay_s), so a
lower power limit really slows it and the device's counter integrates real twin power."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Inventory
from gpuflow.hardware.sim import SimBackend
from gpuflow.hardware.sim import clock as sim_clock
from gpuflow.tasks.energy.optimizer import Objective
from gpuflow.tasks.energy.settings import DeviceSettings
from gpuflow.tasks.energy.tuner import InTrainingTuner, power_limit_grid

NODE, INDEX, OWNER = "v100-0", 0, "job-1"


@dataclass
class Info:
    step: int


class TwinJob:
    """A job on the twin: each step advances sim time by its (paced) duration."""

    def __init__(self, backend: SimBackend, base_s: float = 0.25) -> None:
        self.backend, self.base_s, self.step = backend, base_s, 0
        backend.report_workload(NODE, INDEX, OWNER, 1.0)

    def run(self, tuner: InTrainingTuner, steps: int) -> None:
        for _ in range(steps):
            delay = self.backend.device_delay_s(NODE, INDEX, OWNER, self.base_s)
            self.backend.advance(self.base_s + delay)
            self.step += 1
            tuner(Info(self.step))


@pytest.fixture
def twin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Sim time = wall time + advance(); the wall is frozen here, so only the test's own
    # advance() moves the twin (no host load or scheduling lands in a measured window).
    frozen = time.time()
    monkeypatch.setattr(sim_clock, "time", SimpleNamespace(time=lambda: frozen))
    backend = SimBackend()
    inventory = Inventory(f"sqlite:///{tmp_path / 'inv.db'}")
    inventory.sync(backend)
    yield backend, inventory
    inventory.close()


def _tuner(backend: SimBackend, inventory: Inventory, **kw) -> InTrainingTuner:
    settings = DeviceSettings(backend, inventory, "tuner-test", ttl_s=3600)
    return InTrainingTuner(
        backend,
        settings,
        NODE,
        INDEX,
        Objective(slowdown=0.10),
        warmup=(5, 1.0),
        settle=(2, 0.5),
        probe=(5, 2.0),
        clock=backend.now_s,
        **kw,
    )


def _brute_force(
    backend: SimBackend, grid: list[float], base_s: float
) -> dict[float, tuple[float, float]]:
    """(time, energy) per step at every limit, measured the long way (the test's oracle)."""
    out = {}
    for w in grid:
        backend.set_power_limit_mw(NODE, INDEX, round(w * 1000))
        backend.advance(5.0)  # settle the temperature a little
        e0 = backend.energy_mj(NODE, INDEX)
        dt = base_s + backend.device_delay_s(NODE, INDEX, OWNER, base_s)
        backend.advance(100 * dt)
        out[w] = (dt, (backend.energy_mj(NODE, INDEX) - e0) / 1000 / 100)
    return out


def test_it_chooses_near_the_twins_best_limit_with_few_probes(twin) -> None:
    backend, inventory = twin
    job = TwinJob(backend)
    tuner = _tuner(backend, inventory)
    job.run(tuner, 200)
    assert tuner.done
    c = tuner.choice
    grid = power_limit_grid(backend.power_limits(NODE, INDEX))
    assert len(c.probes) < len(grid)
    assert c.slowdown <= 0.10
    assert c.energy_saving > 0.05  # the fitted V100 at a default-character job: a real saving
    assert backend.power_limits(NODE, INDEX).limit_mw == round(c.chosen.setting * 1000)
    tuner.settings.restore_all()
    truth = _brute_force(backend, grid, job.base_s)
    t_ref, e_ref = truth[max(grid)]
    best_e = min(e for t, e in truth.values() if t <= 1.10 * t_ref)
    # Within the bound on the truth too: the wall clock is frozen (the fixture), so the
    # tuner's windows hold exactly the steps' paced time.
    assert truth[c.chosen.setting][0] <= 1.10 * t_ref
    assert 1 - truth[c.chosen.setting][1] / e_ref >= 0.8 * (1 - best_e / e_ref)


def test_one_odd_window_is_noise_but_a_lasting_change_searches_again(twin) -> None:
    backend, inventory = twin
    job = TwinJob(backend)
    tuner = _tuner(backend, inventory, drift_tolerance=0.25, drift_windows=3)
    job.run(tuner, 200)
    assert len(tuner.decisions) == 1
    job.base_s *= 1.6  # one window's worth of slower steps, then back
    job.run(tuner, 8)
    job.base_s /= 1.6
    job.run(tuner, 60)
    assert len(tuner.decisions) == 1 and not any(e.action == "drift" for e in tuner.events)
    job.base_s *= 1.6  # the workload changed for good
    job.run(tuner, 300)
    assert any(e.action == "drift" for e in tuner.events)
    assert len(tuner.decisions) == 2


def _run_with_noisy_reference(
    job: TwinJob, tuner: InTrainingTuner, steps: int, scales: tuple[float, ...]
) -> None:
    """Steps whose host time is scaled by ``scales[k]`` while the reference's k-th window
    is measured (the host's noise, set exactly per window by the test)."""
    base = job.base_s
    for _ in range(steps):
        k = sum(e.action == "probe" for e in tuner.events)
        job.base_s = base * scales[k] if k < len(scales) and not tuner.done else base
        job.run(tuner, 1)
    job.base_s = base


def test_noise_in_its_reference_windows_guards_the_choice(twin) -> None:
    backend, inventory = twin
    job = TwinJob(backend)
    tuner = _tuner(backend, inventory)
    _run_with_noisy_reference(job, tuner, 200, (1.0, 1.04, 0.96))
    assert tuner.done and tuner.choice.noise > 0.03
    c = tuner.choice
    assert c.slowdown <= tuner.search.bound_ratio() - 1 < 0.10 - 0.05
    tuner.settings.restore_all()
    truth = _brute_force(backend, [c.chosen.setting, max(tuner.grid)], job.base_s)
    assert truth[c.chosen.setting][0] <= 1.07 * truth[max(tuner.grid)][0]


def test_noise_beyond_the_bound_keeps_the_highest_limit_and_widens_the_drift_test(twin) -> None:
    backend, inventory = twin
    job = TwinJob(backend)
    tuner = _tuner(backend, inventory, drift_tolerance=0.25, drift_windows=3)
    _run_with_noisy_reference(job, tuner, 60, (1.0, 1.15, 0.87))
    assert tuner.done and tuner.choice.chosen.setting == max(tuner.grid)
    assert [e.action for e in tuner.events] == ["probe"] * 3 + ["chose"]
    job.base_s *= 1.4  # within three of the measured noise's standard deviations: no drift
    job.run(tuner, 60)
    assert len(tuner.decisions) == 1
    job.base_s *= 2.0  # far beyond it: the workload changed
    job.run(tuner, 60)
    assert any(e.action == "drift" for e in tuner.events)


def test_bad_phases_are_refused(twin) -> None:
    backend, inventory = twin
    settings = DeviceSettings(backend, inventory, "tuner-test")
    with pytest.raises(InvalidRequestError, match="probe steps must be an integer >= 1"):
        InTrainingTuner(backend, settings, NODE, INDEX, probe=(0, 1.0))
    with pytest.raises(InvalidRequestError, match="settle seconds must be >= 0"):
        InTrainingTuner(backend, settings, NODE, INDEX, settle=(1, -1.0))
    with pytest.raises(InvalidRequestError, match="drift_windows"):
        InTrainingTuner(backend, settings, NODE, INDEX, drift_windows=0)
    with pytest.raises(InvalidRequestError, match="reference_windows must be an integer >= 1"):
        InTrainingTuner(backend, settings, NODE, INDEX, reference_windows=0)
