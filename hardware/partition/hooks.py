"""Apply hooks in mig-parted's own hooks-file format (api/hooks/v1).

A hooks file names commands to run around an apply::

    version: v1
    hooks:
      pre-apply-mode:
      - workdir: /etc/nvidia-mig-manager
        command: /bin/bash
        args: ["-c", "source hooks.sh; pre-apply-mode"]
        envs: {FOO: bar}

``apply-start`` runs first, ``pre-apply-mode`` before any MIG mode changes (stop what
holds the GPUs: DCGM, the exporter, the device plugin, so the reset can happen),
``pre-apply-config`` before any partition is created or destroyed, and ``apply-exit``
always last, even after a failure (start them again). As in mig-parted, a hook runs
with only its own ``envs`` plus the apply's MIG_PARTED_* variables (no inherited
environment), argv as a list (never a shell string), in ``workdir``; a non-zero exit
fails the apply. NVIDIA's deployments/systemd/hooks-default.yaml loads as is.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from gpuflow.hardware.backend import HardwareError, InvalidRequestError

log = logging.getLogger(__name__)

HOOK_NAMES = ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit")
_HOOK_FIELDS = ("command", "args", "envs", "workdir")
HOOK_TIMEOUT_S = 600.0  # stopping kubelet or DCGM takes seconds; a hung hook must not hang us


class HookError(HardwareError):
    """A hook exited non-zero, timed out or could not start."""


@dataclass(frozen=True)
class HookSpec:
    command: str
    args: tuple[str, ...] = ()
    envs: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None

    def run(self, name: str, envs: Mapping[str, str]) -> None:
        argv = [self.command, *self.args]
        env = {**self.envs, **envs}  # the apply's variables win, as in mig-parted
        try:
            done = subprocess.run(  # noqa: S603 (the operator's own hook file, argv list, no shell)
                argv,
                env=env,
                cwd=self.workdir or None,
                capture_output=True,
                text=True,
                timeout=HOOK_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise HookError(f"{name} hook {self.command!r} could not run: {exc}") from exc
        if done.stdout:
            log.info("%s hook %s: %s", name, self.command, done.stdout.strip())
        if done.returncode != 0:
            tail = (done.stderr or done.stdout or "").strip()[-800:]
            raise HookError(
                f"{name} hook {self.command!r} exited {done.returncode}"
                + (f": {tail}" if tail else "")
            )


@dataclass(frozen=True)
class ApplyHooks:
    """The hooks of one file; a name with no hooks runs nothing."""

    hooks: Mapping[str, tuple[HookSpec, ...]] = field(default_factory=dict)
    source: str = "<none>"

    def run(self, name: str, envs: Mapping[str, str]) -> None:
        if name not in HOOK_NAMES:
            raise InvalidRequestError(f"unknown hook {name!r}; hooks are {', '.join(HOOK_NAMES)}")
        for spec in self.hooks.get(name, ()):
            spec.run(name, envs)


NO_HOOKS = ApplyHooks()


def _spec(raw: object, where: str) -> HookSpec:
    if not isinstance(raw, dict):
        raise InvalidRequestError(f"{where}: a hook is a mapping with a command, got {raw!r}")
    unknown = sorted(set(raw) - set(_HOOK_FIELDS))
    if unknown:
        raise InvalidRequestError(
            f"{where}: unknown field(s) {unknown}; a hook has {', '.join(_HOOK_FIELDS)}"
        )
    command = raw.get("command")
    if not isinstance(command, str) or not command.strip():
        raise InvalidRequestError(f"{where}: command must be a non-empty string, got {command!r}")
    args = raw.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise InvalidRequestError(f"{where}: args must be a list of strings, got {args!r}")
    envs = raw.get("envs") or {}
    if not isinstance(envs, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in envs.items()
    ):
        raise InvalidRequestError(f"{where}: envs must map names to strings, got {envs!r}")
    workdir = raw.get("workdir")
    if workdir is not None and not isinstance(workdir, str):
        raise InvalidRequestError(f"{where}: workdir must be a path, got {workdir!r}")
    return HookSpec(command=command, args=tuple(args), envs=dict(envs), workdir=workdir)


def parse_hooks(doc: Any, source: str = "<string>") -> ApplyHooks:
    """A hooks document (already parsed YAML), checked whole before anything runs."""
    if not isinstance(doc, dict):
        raise InvalidRequestError(f"{source}: a hooks file is a mapping with version and hooks")
    if doc.get("version") != "v1":
        raise InvalidRequestError(f"{source}: version must be v1, got {doc.get('version')!r}")
    unknown = sorted(set(doc) - {"version", "hooks"})
    if unknown:
        raise InvalidRequestError(f"{source}: unknown field(s) {unknown}")
    raw = doc.get("hooks") or {}
    if not isinstance(raw, dict):
        raise InvalidRequestError(f"{source}: hooks must map hook names to lists")
    bad = sorted(set(raw) - set(HOOK_NAMES))
    if bad:
        raise InvalidRequestError(
            f"{source}: unknown hook name(s) {bad}; hooks are {', '.join(HOOK_NAMES)}"
        )
    out: dict[str, tuple[HookSpec, ...]] = {}
    for name, specs in raw.items():
        if not isinstance(specs, list):
            raise InvalidRequestError(f"{source}: {name} must be a list of hooks")
        out[name] = tuple(_spec(s, f"{source}: {name}[{i}]") for i, s in enumerate(specs))
    return ApplyHooks(hooks=out, source=source)


def load_hooks(path: Path | str) -> ApplyHooks:
    """Read and check a mig-parted hooks file."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise InvalidRequestError(f"cannot read hooks file {p}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise InvalidRequestError(f"hooks file {p} is not valid YAML: {exc}") from exc
    return parse_hooks(doc, str(p))
