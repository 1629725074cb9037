"""The edge run's failure bookkeeping, on a real SQLite MLflow store."""

from __future__ import annotations

import pytest
from gpuflow.tasks.edge.deploy import Deployment
from gpuflow.tasks.edge.recording import STATUS_TAG, failed_run_on_error, record_check
from gpuflow.tasks.edge.verify import CheckResult
from gpuflow.tasks.tracking import open_run, tracking_client


@pytest.mark.parametrize(
    ("status", "tag"), [("failed", "failed"), ("rolled-back", "rolled-back"), ("active", None)]
)
def test_a_failed_flow_tags_a_failed_deployment(status: str, tag: str | None) -> None:
    run_id = open_run("edge-test", "digits-v1")
    deployment = Deployment("digits", "v1", "resnet18-digits", "forward", status)
    with pytest.raises(RuntimeError, match="boom"), failed_run_on_error(run_id, deployment):
        raise RuntimeError("boom")
    run = tracking_client().get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags.get(STATUS_TAG) == tag


def test_an_unanswered_check_logs_a_finite_diff() -> None:
    run_id = open_run("edge-test", "digits-v1")
    record_check(run_id, CheckResult(False, float("inf"), 1e-4, 2, "refused"))
    assert tracking_client().get_run(run_id).data.metrics == {"max_abs_diff": 1e30}
