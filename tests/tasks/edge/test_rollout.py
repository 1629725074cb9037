"""A new version's outcome: failed build, roll back, promote (deployments without shards:
the records, not processes, are under test here)."""

from __future__ import annotations

import logging

import pytest
from gpuflow.tasks.edge.deploy import Deployment, EdgeDeployError, current_version, set_current
from gpuflow.tasks.edge.rollout import failed_build, promote, roll_back, rollback, start_version
from gpuflow.tasks.edge.verify import CheckResult

FAILED_CHECK = CheckResult(passed=False, max_abs_diff=0.5, atol=1e-4, samples=2)
PASSED_CHECK = CheckResult(passed=True, max_abs_diff=1e-6, atol=1e-4, samples=2)


def test_start_version_names_the_current_one() -> None:
    previous, first = start_version("digits", "resnet18-digits", "forward")
    assert previous is None and first.version == "v1"
    assert Deployment.load("digits", "v1").status == "planning"
    set_current("digits", "v1")
    previous, second = start_version("digits", "resnet18-digits", "driver")
    assert previous == "v1" and second.version == "v2" and second.mode == "driver"


def test_failed_build_saves_the_error() -> None:
    _, deployment = start_version("digits", "resnet18-digits", "forward")
    with failed_build(deployment):
        pass
    assert Deployment.load("digits", "v1").status == "planning"
    with pytest.raises(RuntimeError, match="export broke"), failed_build(deployment):
        raise RuntimeError("export broke")
    saved = Deployment.load("digits", "v1")
    assert saved.status == "failed" and saved.note == "RuntimeError: export broke"


def test_roll_back_keeps_the_previous_version() -> None:
    _, deployment = start_version("digits", "resnet18-digits", "forward")
    note = roll_back(deployment, "v1", FAILED_CHECK)
    assert note == "check failed (max abs diff 0.5 > atol 0.0001); rolled back to v1"
    saved = Deployment.load("digits", deployment.version)
    assert saved.status == "rolled-back" and saved.note == note
    assert saved.check == FAILED_CHECK.to_dict()


def test_roll_back_without_a_previous_version_fails_it() -> None:
    _, deployment = start_version("digits", "resnet18-digits", "forward")
    check = CheckResult(False, float("inf"), 1e-4, 2, "ConnectionError: refused")
    note = roll_back(deployment, None, check)
    assert note == "check failed (ConnectionError: refused); no previous version to keep"
    assert Deployment.load("digits", deployment.version).status == "failed"


def test_promote_keeps_the_previous_version_as_standby_and_supersedes_older() -> None:
    _, first = start_version("digits", "resnet18-digits", "forward")
    promote(first, None, PASSED_CHECK)
    previous, second = start_version("digits", "resnet18-digits", "forward")
    assert previous == "v1"
    promote(second, previous, PASSED_CHECK)
    assert current_version("digits") == "v2"
    saved = Deployment.load("digits", "v2")
    assert saved.status == "active" and saved.check == PASSED_CHECK.to_dict()
    assert Deployment.load("digits", "v1").status == "standby"
    previous, third = start_version("digits", "resnet18-digits", "forward")
    promote(third, previous, PASSED_CHECK)
    assert Deployment.load("digits", "v2").status == "standby"
    assert Deployment.load("digits", "v1").status == "superseded"


def test_rollback_returns_to_the_standby() -> None:
    _, first = start_version("digits", "resnet18-digits", "forward")
    with pytest.raises(EdgeDeployError, match="no current version"):
        rollback("digits")
    promote(first, None, PASSED_CHECK)
    with pytest.raises(EdgeDeployError, match="no standby version to roll back to"):
        rollback("digits")
    previous, second = start_version("digits", "resnet18-digits", "forward")
    promote(second, previous, PASSED_CHECK)
    back = rollback("digits")
    assert back.version == "v1" and current_version("digits") == "v1"
    assert Deployment.load("digits", "v1").status == "active"
    assert Deployment.load("digits", "v2").status == "rolled-back"


def test_promote_logs_a_previous_version_it_cannot_keep(caplog: pytest.LogCaptureFixture) -> None:
    _, deployment = start_version("digits", "resnet18-digits", "forward")
    with caplog.at_level(logging.WARNING):
        promote(deployment, "v9", PASSED_CHECK, logging.getLogger("test"))
    assert current_version("digits") == "v1"
    assert "could not keep previous version v9 as standby" in caplog.text
