"""mig-parted hooks files: NVIDIA's own load as they are; bad ones are refused whole."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.partition import HookError, load_hooks
from gpuflow.hardware.partition.hooks import parse_hooks

from tests.hardware.partition.helpers import PLANS

MIG_PARTED = PLANS / "mig-parted"


def test_nvidia_s_hooks_files_load_verbatim() -> None:
    hooks = load_hooks(MIG_PARTED / "hooks-default.yaml")
    assert set(hooks.hooks) == {"apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit"}
    (mode,) = hooks.hooks["pre-apply-mode"]
    assert mode.command == "/bin/bash" and mode.workdir == "/etc/nvidia-mig-manager"
    assert mode.args == ("-x", "-c", "source hooks.sh; pre-apply-mode")
    assert len(hooks.hooks["apply-exit"]) == 2
    assert set(load_hooks(MIG_PARTED / "hooks-minimal.yaml").hooks) == {"apply-start"}


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"version": "v2", "hooks": {}}, "version must be v1"),
        ({"version": "v1", "hooks": {"pre-apply": []}}, "unknown hook name(s) ['pre-apply']"),
        ({"version": "v1", "hooks": {"apply-exit": [{"args": ["x"]}]}}, "apply-exit[0]: command"),
        (
            {"version": "v1", "hooks": {"apply-exit": [{"command": "x", "args": "a b"}]}},
            "args must be a list of strings",
        ),
        (
            {"version": "v1", "hooks": {"apply-exit": [{"command": "x", "shell": True}]}},
            "unknown field(s) ['shell']",
        ),
        (
            {"version": "v1", "hooks": {"apply-exit": [{"command": "x", "envs": {"A": 1}}]}},
            "envs must map names to strings",
        ),
        ({"version": "v1", "extra": 1}, "unknown field(s) ['extra']"),
    ],
)
def test_bad_hooks_files_are_refused_naming_what_is_wrong(doc, says) -> None:
    with pytest.raises(InvalidRequestError) as ei:
        parse_hooks(doc, "h.yaml")
    assert says in str(ei.value) and "h.yaml" in str(ei.value)


def test_a_hook_that_fails_or_cannot_start_says_which(tmp_path: Path) -> None:
    hooks = parse_hooks(
        {
            "version": "v1",
            "hooks": {
                "apply-start": [
                    {"command": sys.executable, "args": ["-c", "import sys; sys.exit('no dcgm')"]}
                ],
                "apply-exit": [{"command": str(tmp_path / "missing")}],
            },
        }
    )
    with pytest.raises(HookError, match=r"apply-start hook .* exited 1: no dcgm"):
        hooks.run("apply-start", {})
    with pytest.raises(HookError, match="apply-exit hook .*missing.* could not run"):
        hooks.run("apply-exit", {})
    hooks.run("pre-apply-mode", {})  # no hooks of that name: nothing to run
    with pytest.raises(InvalidRequestError, match="unknown hook"):
        hooks.run("pre-apply", {})
