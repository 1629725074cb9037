"""Applying plans as mig-parted does: a mode phase, a reset where NVML left the change
pending (hooks stop what holds the GPU), then partitions; busy devices refused first."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from gpuflow.hardware.backend import DeviceBusyError, PartitionModeState
from gpuflow.hardware.partition import (
    HookError,
    PlanApplyError,
    apply_plan,
    assert_plan,
    load_hooks,
    load_plan,
)

from tests.hardware.partition.helpers import Proxy, exact_state

GPUFLOW = str(Path(sys.executable).with_name("gpuflow"))
A0 = ("a100-0", 0)

PLAN = load_plan(
    {
        "version": "v1",
        "mig-configs": {
            "balanced": [
                {
                    "devices": [0],
                    "mig-enabled": True,
                    "mig-devices": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
                }
            ],
            "off": [{"devices": [0], "mig-enabled": False}],
            "two": [{"devices": [0, 1], "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}],
        },
    }
)


def _hooks(tmp_path: Path, **by_name: list[list[str]]) -> Path:
    """A mig-parted hooks file running ``gpuflow`` commands against this test's twin."""
    doc = {
        "version": "v1",
        "hooks": {
            name.replace("_", "-"): [
                {"command": GPUFLOW, "args": args, "envs": {"GPUFLOW_HOME": str(tmp_path)}}
                for args in commands
            ]
            for name, commands in by_name.items()
        },
    }
    path = tmp_path / "hooks.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _marker_hook(tmp_path: Path, name: str, marker: Path, fail: bool = False) -> dict:
    code = f"open({str(marker)!r}, 'a').write({name!r} + '\\n')" + (
        "; raise SystemExit(3)" if fail else ""
    )
    return {"command": sys.executable, "args": ["-c", code]}


def test_a_held_gpu_leaves_its_mode_change_pending_and_a_blocked_reset_leaves_nothing_pending(
    backend,
) -> None:
    backend.hold_device(*A0, "nv-hostengine")
    before = exact_state(backend)
    with pytest.raises(PlanApplyError) as ei:
        apply_plan(backend, PLAN, "balanced", nodes=["a100-0"])
    err = ei.value
    assert "resetting a100-0:0" in err.step
    assert "in use by nv-hostengine" in str(err)  # says what held the GPU
    assert err.rolled_back == ["a100-0:0"] and err.rollback_failures == {}
    assert backend.partition_mode_state(*A0) == PartitionModeState(False, False)
    assert exact_state(backend) == before
    calls = [(c["call"], c.get("pending")) for c in backend.change_log()]
    assert calls == [("set_partition_mode", True), ("set_partition_mode", False)]


def test_a_pre_apply_mode_hook_stops_the_holder_the_reset_applies_the_mode_and_apply_exit_restarts_it(
    backend, tmp_path: Path
) -> None:
    device = "a100-0:0"
    backend.hold_device(*A0, "nv-hostengine")
    backend.set_passthrough(*A0)  # in a VM: the mode change waits for a reset anyway
    hooks = load_hooks(
        _hooks(
            tmp_path,
            pre_apply_mode=[["sim", "release", "-d", device, "nv-hostengine"]],
            apply_exit=[["sim", "hold", "-d", device, "nv-hostengine"]],
        )
    )
    report = apply_plan(backend, PLAN, "balanced", nodes=["a100-0"], hooks=hooks)
    assert report.reset == ("a100-0:0",)
    assert assert_plan(backend, PLAN, "balanced", nodes=["a100-0"]) == []
    assert backend.partition_mode_state(*A0) == PartitionModeState(True, True)
    assert backend.holders(*A0) == ["nv-hostengine"]  # started again by apply-exit
    calls = [c["call"] for c in backend.change_log()]
    assert calls == ["set_partition_mode", "reset", "create_partitions"]


def test_skip_reset_leaves_the_mode_pending_and_the_device_unpartitioned(backend) -> None:
    backend.hold_device(*A0, "nv-hostengine")
    report = apply_plan(backend, PLAN, "balanced", nodes=["a100-0"], skip_reset=True)
    (change,) = report.changed
    assert change.pending_reset and "pending a GPU reset" in change.after_summary
    assert report.reset == ()
    assert backend.partition_mode_state(*A0) == PartitionModeState(False, True)
    assert backend.partitions(*A0) == []
    assert assert_plan(backend, PLAN, "balanced", nodes=["a100-0"])  # not there yet
    # A later apply (the holder gone) finishes the job: with nothing holding the GPU,
    # NVML's set-mode call activates the mode itself, no separate reset needed.
    backend.release_device(*A0, "nv-hostengine")
    report = apply_plan(backend, PLAN, "balanced", nodes=["a100-0"])
    assert report.reset == () and not report.changed[0].pending_reset
    assert assert_plan(backend, PLAN, "balanced", nodes=["a100-0"]) == []


def test_a_pending_change_left_behind_is_cancelled_when_the_plan_wants_the_current_mode(
    backend,
) -> None:
    backend.hold_device(*A0, "nv-hostengine")
    backend.set_partition_mode(*A0, True)  # someone else's change, left pending
    assert backend.partition_mode_state(*A0).reset_pending
    report = apply_plan(backend, PLAN, "off", nodes=["a100-0"])
    assert [d.index for d in report.changed] == [0]
    assert backend.partition_mode_state(*A0) == PartitionModeState(False, False)


def test_a_device_in_use_is_refused_before_any_device_changes(backend) -> None:
    backend.set_workload("a100-0", 1, "job-7", 0.8)
    proxy = Proxy(backend)
    with pytest.raises(DeviceBusyError) as ei:
        apply_plan(proxy, PLAN, "two", nodes=["a100-0"])
    assert ei.value.busy == {"a100-0:1": ["tenant job-7"]}
    assert "a100-0:1 by tenant job-7" in str(ei.value)
    assert proxy.mutations == 0
    assert backend.change_log() == []  # the twin's log: a100-0:0 was not touched either


def test_a_busy_device_already_in_its_layout_is_not_a_reason_to_refuse(backend) -> None:
    apply_plan(backend, PLAN, "two", nodes=["a100-0"])
    part = backend.partitions("a100-0", 1)[0]
    backend.set_workload("a100-0", 1, "job-7", 0.5, partition_uuid=part.uuid)
    report = apply_plan(backend, PLAN, "two", nodes=["a100-0"])
    assert report.changed == []


def test_a_failing_hook_rolls_back_what_the_mode_phase_changed_and_apply_exit_still_runs(
    backend, tmp_path: Path
) -> None:
    marker = tmp_path / "hooks-ran"
    path = tmp_path / "hooks.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "version": "v1",
                "hooks": {
                    "pre-apply-mode": [_marker_hook(tmp_path, "pre-apply-mode", marker)],
                    "pre-apply-config": [
                        _marker_hook(tmp_path, "pre-apply-config", marker, fail=True)
                    ],
                    "apply-exit": [_marker_hook(tmp_path, "apply-exit", marker)],
                },
            }
        )
    )
    before = exact_state(backend)
    with pytest.raises(PlanApplyError) as ei:
        apply_plan(backend, PLAN, "balanced", nodes=["a100-0"], hooks=load_hooks(path))
    assert "pre-apply-config hook" in str(ei.value) and "exited 3" in str(ei.value)
    assert isinstance(ei.value.__cause__, HookError)
    assert exact_state(backend) == before
    assert marker.read_text().split() == ["pre-apply-mode", "pre-apply-config", "apply-exit"]


def test_hooks_see_only_their_envs_and_the_apply_s_mig_parted_variables(
    backend, tmp_path: Path
) -> None:
    out = tmp_path / "env.yaml"
    code = f"import os, json; open({str(out)!r}, 'w').write(json.dumps(dict(os.environ)))"
    path = tmp_path / "hooks.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "version": "v1",
                "hooks": {
                    "apply-start": [
                        {"command": sys.executable, "args": ["-c", code], "envs": {"A": "1"}}
                    ]
                },
            }
        )
    )
    apply_plan(
        backend,
        PLAN,
        "off",
        nodes=["a100-0"],
        hooks=load_hooks(path),
        hook_envs={"MIG_PARTED_CONFIG_FILE": "plan.yaml"},
    )
    seen = yaml.safe_load(out.read_text())
    seen.pop("LC_CTYPE", None)  # some Pythons set it on start
    assert seen == {
        "A": "1",
        "MIG_PARTED_SELECTED_CONFIG": "off",
        "MIG_PARTED_SKIP_RESET": "false",
        "MIG_PARTED_CONFIG_FILE": "plan.yaml",
    }


def test_a_gpu_that_fell_off_the_bus_is_skipped_and_reported_not_blocking_the_rest(
    backend,
) -> None:
    backend.inject_fault("a100-0", 1, "xid79")
    report = apply_plan(backend, PLAN, "two", nodes=["a100-0"])
    assert report.skipped_lost == ("a100-0:1",)
    assert [(d.node, d.index) for d in report.changed] == [("a100-0", 0)]
    assert assert_plan(backend, PLAN, "two", nodes=["a100-0"]) == []
