"""The tour's size knob (gpuflow/tour/__init__.py); the whole tour runs, `--quick`, in
tests/gpuflow/test_controlplane.py before `gpuflow up` shows what it recorded."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import InvalidRequestError

from gpuflow.tour import TourSize


def test_quick_is_smaller_in_every_step() -> None:
    full, quick = TourSize(), TourSize.quick()
    assert quick.compare_steps < full.compare_steps
    assert quick.compare_batch_size < full.compare_batch_size
    assert quick.remediation_steps < full.remediation_steps
    assert quick.edge_requests < full.edge_requests


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("compare_steps", 0),
        ("compare_batch_size", 0),
        ("remediation_steps", 5),
        ("edge_requests", True),
        ("compare_steps", 2.5),
    ],
)
def test_a_size_that_cannot_run_is_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidRequestError, match=f"TourSize.{field} must be an int"):
        TourSize(**{field: value})
