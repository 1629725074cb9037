"""The V100 trace's twin fit, once per module that asks for it (about 3 s)."""

from __future__ import annotations

import pytest
from gpuflow.tasks.energy.twin_fit import V100_TRACE_DEVICE, FitReport, fit_twin

from tests.helpers.traces import V100


@pytest.fixture(scope="module")
def fit() -> FitReport:
    return fit_twin(V100, V100_TRACE_DEVICE)
