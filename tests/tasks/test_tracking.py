"""tasks.tracking against a real SQLite MLflow store: open, tag, log, close, fail.

One store for the module (MLFLOW_TRACKING_URI; creating one takes seconds), an experiment
per test; the last test uses the default store under GPUFLOW_HOME.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpuflow.tasks import tracking
from gpuflow.tasks.tracking import (
    close_run,
    fail_on_error,
    log_figure,
    log_json,
    log_metrics,
    log_tags,
    log_text,
    open_run,
    tracking_client,
)


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow-store') / 'mlflow.db'}"


@pytest.fixture
def experiment(store_uri: str, monkeypatch: pytest.MonkeyPatch, request) -> Iterator[str]:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store_uri)
    yield f"test-{request.node.name}"


def _read_artifact(run_id: str, path: str, tmp_path: Path) -> str:
    local = tracking_client().download_artifacts(run_id, path, str(tmp_path))
    return Path(local).read_text()


def test_open_run_records_name_tags_params_and_parent(experiment: str) -> None:
    parent = open_run(experiment, "parent")
    child = open_run(
        experiment,
        "child",
        tags={"gpuflow.job_id": "j1", "unset": None},
        params={"steps": 30, "lr": 0.5, "dataset": None, "name": "x"},
        parent_run_id=parent,
    )
    run = tracking_client().get_run(child)
    assert run.info.status == "RUNNING"
    assert run.info.run_name == "child"
    assert tracking_client().get_experiment(run.info.experiment_id).name == experiment
    assert run.data.params == {"steps": "30", "lr": "0.5", "name": "x"}
    assert run.data.tags["gpuflow.job_id"] == "j1"
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert "unset" not in run.data.tags
    assert "mlflow.parentRunId" not in tracking_client().get_run(parent).data.tags


def test_open_run_logs_more_params_than_one_batch_takes(experiment: str) -> None:
    params = {f"p{i:03d}": i for i in range(250)}  # MLflow takes 100 per batch
    run = tracking_client().get_run(open_run(experiment, "many", params=params))
    assert run.data.params == {k: str(v) for k, v in params.items()}


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("", "r"), {}, "experiment must be a non-empty string"),
        (("{exp}", ""), {}, "run_name must be a non-empty string"),
        (("{exp}", "r"), {"parent_run_id": "0" * 32}, "parent run '0{32}' not found"),
    ],
)
def test_open_run_refuses_bad_input_before_any_change(
    experiment: str, args: tuple, kwargs: dict, message: str
) -> None:
    args = tuple(a.format(exp=experiment) for a in args)
    with pytest.raises(ValueError, match=message):
        open_run(*args, **kwargs)
    assert tracking_client().get_experiment_by_name(experiment) is None  # nor a run in it


def test_open_run_marks_the_run_failed_when_its_params_are_refused(experiment: str) -> None:
    with pytest.raises(Exception, match="bad!key"):
        open_run(experiment, "r", params={"bad!key": 1})  # MLflow refuses the "!" in a key
    (run,) = tracking_client().search_runs(
        [tracking_client().get_experiment_by_name(experiment).experiment_id]
    )
    assert run.info.status == "FAILED"


def test_log_metrics_batches_skips_none_and_keeps_the_step(experiment: str) -> None:
    run_id = open_run(experiment, "r")
    metrics: dict[str, float | None] = {f"m{i}": float(i) for i in range(2500)}  # 3 batches
    metrics["unset"] = None
    log_metrics(run_id, metrics, step=7)
    data = tracking_client().get_run(run_id).data
    assert data.metrics == {f"m{i}": float(i) for i in range(2500)}
    assert [(m.step, m.value) for m in tracking_client().get_metric_history(run_id, "m42")] == [
        (7, 42.0)
    ]


@pytest.mark.parametrize("bad", ["fast", True, [1.0]])
def test_log_metrics_refuses_a_non_number_before_sending_any(experiment: str, bad) -> None:
    run_id = open_run(experiment, "r")
    with pytest.raises(ValueError, match="metric 'speed' must be a number"):
        log_metrics(run_id, {"loss": 1.0, "speed": bad})
    assert tracking_client().get_run(run_id).data.metrics == {}


def test_log_tags_sets_strings_and_overwrites(experiment: str) -> None:
    run_id = open_run(experiment, "r", tags={"gpuflow.status": "planning"})
    log_tags(run_id, {"gpuflow.status": "active", "gpuflow.index": 3, "unset": None})
    tags = tracking_client().get_run(run_id).data.tags
    assert tags["gpuflow.status"] == "active" and tags["gpuflow.index"] == "3"
    assert "unset" not in tags


def test_json_text_and_figure_artifacts(experiment: str, tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_id = open_run(experiment, "r")
    rows = [{"policy": "auto", "speedup": 1.5}]
    log_json(run_id, rows, "comparison.json")
    log_text(run_id, "hello\n", "notes/hello.txt")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    log_figure(run_id, fig, "plot.png")
    plt.close(fig)
    assert _read_artifact(run_id, "comparison.json", tmp_path) == json.dumps(rows, indent=2)
    assert _read_artifact(run_id, "notes/hello.txt", tmp_path) == "hello\n"
    png = Path(tracking_client().download_artifacts(run_id, "plot.png", str(tmp_path)))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_close_run_sets_the_end_status(experiment: str) -> None:
    run_id = open_run(experiment, "r")
    with pytest.raises(ValueError, match="status must be one of FINISHED, FAILED, KILLED"):
        close_run(run_id, "DONE")
    assert tracking_client().get_run(run_id).info.status == "RUNNING"
    close_run(run_id)
    info = tracking_client().get_run(run_id).info
    assert info.status == "FINISHED" and info.end_time is not None
    close_run(run_id, "KILLED")
    assert tracking_client().get_run(run_id).info.status == "KILLED"


class _Cancelled(BaseException):
    """Stands in for a cancellation: not an Exception."""


@pytest.mark.parametrize("error", [RuntimeError("boom"), _Cancelled("boom")])
def test_fail_on_error_marks_failed_and_reraises(experiment: str, error: BaseException) -> None:
    run_id = open_run(experiment, "r")
    with pytest.raises(type(error), match="boom"), fail_on_error(run_id) as inside:
        assert inside == run_id
        raise error
    assert tracking_client().get_run(run_id).info.status == "FAILED"


def test_fail_on_error_leaves_a_run_that_did_not_fail_open(experiment: str) -> None:
    run_id = open_run(experiment, "r")
    with fail_on_error(run_id):
        log_metrics(run_id, {"loss": 1.0})
    assert tracking_client().get_run(run_id).info.status == "RUNNING"


def test_fail_on_error_keeps_the_body_error_when_the_store_fails(
    experiment: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    run_id = open_run(experiment, "r")

    def unreachable(*args, **kwargs) -> None:
        raise ConnectionError("tracking server unreachable")

    monkeypatch.setattr(tracking, "close_run", unreachable)
    with caplog.at_level(logging.WARNING, logger=tracking.__name__):
        with pytest.raises(RuntimeError, match="the body's error"), fail_on_error(run_id):
            raise RuntimeError("the body's error")
    assert f"could not mark MLflow run {run_id} FAILED" in caplog.text


def test_default_store_and_artifacts_are_under_gpuflow_home(gpuflow_home: Path) -> None:
    run_id = open_run("test-default-store", "r")
    log_text(run_id, "x", "x.txt")
    assert tracking.tracking_uri() == f"sqlite:///{gpuflow_home / 'mlflow' / 'mlflow.db'}"
    assert (gpuflow_home / "mlflow" / "mlflow.db").is_file()
    assert list((gpuflow_home / "mlflow" / "artifacts").rglob("x.txt"))


def test_two_runs_creating_one_experiment_at_once_both_get_it(
    experiment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the two-hosts test: two train runs starting at once on a fresh store both
    found no experiment; the second's create failed with RESOURCE_ALREADY_EXISTS and its
    run failed. Here the other run creates it between this one's look-up and create."""
    from mlflow.tracking import MlflowClient

    theirs = tracking_client().create_experiment(experiment)
    real = MlflowClient.get_experiment_by_name
    looked = []

    def not_yet_then_real(self, name):
        looked.append(name)
        return None if len(looked) == 1 else real(self, name)

    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", not_yet_then_real)
    assert tracking.use_experiment(experiment) == theirs
    assert looked == [experiment, experiment]
