"""progress_publisher (tasks/energy/progress.py): the step hook that publishes a job's
progress, throttled; and the two decision plots (tasks/energy/plots.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Inventory
from gpuflow.tasks.energy.optimizer import Measurement, Objective, search
from gpuflow.tasks.energy.plots import curve_plot, pareto_front, pareto_plot
from gpuflow.tasks.energy.progress import progress_publisher

from tests.helpers.clock import ManualClock


@pytest.fixture
def inv(tmp_path: Path) -> Iterator[Inventory]:
    inventory = Inventory(f"sqlite:///{tmp_path / 'inv.db'}")
    yield inventory
    inventory.close()


def step(n: int) -> SimpleNamespace:  # the one field the hook reads of a StepInfo
    return SimpleNamespace(step=n)


def test_it_publishes_the_first_step_then_at_most_every_every_s(inv: Inventory) -> None:
    clock = ManualClock(0.0)
    hook = progress_publisher(inv, "job-1", every_s=1.0, clock=clock)
    hook(step(1))  # type: ignore[arg-type]
    assert inv.job_progress("job-1").units_done == 1  # type: ignore[union-attr]
    clock.t = 0.5
    hook(step(2))  # type: ignore[arg-type]
    assert inv.job_progress("job-1").units_done == 1  # type: ignore[union-attr]
    clock.t = 1.0
    hook(step(3))  # type: ignore[arg-type]
    assert inv.job_progress("job-1").units_done == 3  # type: ignore[union-attr]


def test_a_failed_write_is_logged_not_raised_and_bad_input_is(
    inv: Inventory, caplog: pytest.LogCaptureFixture
) -> None:
    broken = SimpleNamespace(report_progress=lambda *a, **k: 1 / 0)
    hook = progress_publisher(broken, "job-1", every_s=0)  # type: ignore[arg-type]
    hook(step(1))  # type: ignore[arg-type]
    assert "progress at step 1 not published" in caplog.text
    with pytest.raises(InvalidRequestError, match="job_id must be a non-empty string"):
        progress_publisher(inv, "")
    with pytest.raises(InvalidRequestError, match="every_s must be a number of seconds >= 0"):
        progress_publisher(inv, "job-1", every_s=-1)


def _choice():  # type: ignore[no-untyped-def]
    def measure(w: float) -> Measurement:
        t = max(1.0, 300.0 / w) ** 0.5
        return Measurement(w, t, min(w, 300.0) * t)

    return search([150, 200, 250, 300], measure, Objective(slowdown=0.10))


def test_the_plots_draw_the_front_the_choice_and_the_curve(tmp_path: Path) -> None:
    c = _choice()
    front = pareto_front(c.probes)
    assert front[0] == c.reference and all(
        a.energy_j > b.energy_j for a, b in zip(front, front[1:], strict=False)
    )
    fig = pareto_plot(c, tmp_path / "pareto.png")
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert f"chosen ({c.chosen.setting:g} W)" in labels and "Pareto front" in labels
    curve = curve_plot(c, 0.5, tmp_path / "curve.png")
    assert "fitted, k = 0.50" in curve.axes[0].get_legend_handles_labels()[1]
    assert (tmp_path / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "curve.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="search_or_exponent"):
        curve_plot(c, -1.0)
