"""A gate a test holds a training job at: the job stops at one known step until the test
opens the gate, so it is surely still running when the test acts (injects a fault,
triggers remediation). No step counts tuned to outrun the clock, no sleeps.

A job in this process takes the gate as a step hook (``InProcessRunner.start(step_hooks=
(gate.hook,))``) or as a training step observer (``tasks.training.control.step_observers``).
A job in another process (a Prefect worker's flow run) gets it through the environment:
``gate.env()`` names the gate and puts ``gate_site/`` on PYTHONPATH, whose
``sitecustomize`` adds the gate to that process's step observers. The gate's state is two
files in its folder, so every process sees the same gate.

Standard library only: ``gate_site/sitecustomize.py`` loads this file at interpreter start.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "GPUFLOW_TEST_STEP_GATE"
SITE_DIR = Path(__file__).with_name("gate_site")
_POLL_S = 0.02


class StepGateTimeout(RuntimeError):
    """The gate was never opened: the job fails instead of hanging its test."""


@dataclass(frozen=True)
class StepGate:
    """Holds a job after its step ``at_step`` (the step is trained, its hooks run; the
    control channel is polled right after the gate) until ``open()``.

    With ``opens_on_request`` the job's own pending control request (checkpoint-now or
    checkpoint-and-stop, as remediation sends it) opens the gate too: the test triggers
    remediation, remediation asks, the job answers at exactly ``at_step``. Once open the
    gate stays open (a resumed job training the step again goes through).
    """

    folder: Path
    at_step: int
    job_id: str | None = None  # the observer's filter; None: any job
    opens_on_request: bool = False
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.at_step < 1:
            raise ValueError(f"a gate holds a job after a step >= 1, got at_step={self.at_step}")
        if self.opens_on_request and not self.job_id:
            raise ValueError("a gate that opens on the job's control request needs its job_id")
        Path(self.folder).mkdir(parents=True, exist_ok=True)

    @property
    def _reached_file(self) -> Path:
        return Path(self.folder) / "reached"

    @property
    def _open_file(self) -> Path:
        return Path(self.folder) / "open"

    @property
    def reached(self) -> bool:
        return self._reached_file.exists()

    @property
    def is_open(self) -> bool:
        return self._open_file.exists()

    def open(self) -> None:
        self._open_file.touch()

    def wait_reached(self, timeout_s: float) -> bool:
        """True once the job waits at the gate (or went through it) within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.reached:
            if time.monotonic() > deadline:
                return False
            time.sleep(_POLL_S)
        return True

    def hook(self, info: Any) -> None:
        """A step hook (``info`` a StepInfo): wait here after step ``at_step``."""
        if info.step != self.at_step or self.is_open:
            return
        self._reached_file.touch()
        control = None
        if self.opens_on_request:
            from gpuflow.hardware.inventory import Inventory

            control = Inventory()
        deadline = time.monotonic() + self.timeout_s
        while not self.is_open:
            if control is not None and control.poll_control(self.job_id) is not None:
                self.open()
                return
            if time.monotonic() > deadline:
                raise StepGateTimeout(
                    f"the test never opened the gate at step {self.at_step} "
                    f"({self.folder}) within {self.timeout_s:g} s"
                )
            time.sleep(_POLL_S)

    def observer(self, job_id: str, total: int, info: Any) -> None:
        """The same, as a ``tasks.training.control.step_observers`` entry (every job of the
        process passes by; only ``job_id``'s is held)."""
        if self.job_id is None or job_id == self.job_id:
            self.hook(info)

    # -- across processes -----------------------------------------------------------------
    def env(self, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
        """What another process's environment needs to hold its job at this gate."""
        return gates_env([self], environ)

    def _spec(self) -> dict[str, Any]:
        return {
            "folder": str(self.folder),
            "at_step": self.at_step,
            "job_id": self.job_id,
            "opens_on_request": self.opens_on_request,
            "timeout_s": self.timeout_s,
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> StepGate | None:
        gates = cls.all_from_env(environ)
        return gates[0] if gates else None

    @classmethod
    def all_from_env(cls, environ: Mapping[str, str] = os.environ) -> list[StepGate]:
        raw = environ.get(ENV)
        if not raw:
            return []
        specs = json.loads(raw)
        return [cls(Path(spec.pop("folder")), **spec) for spec in specs]


def gates_env(gates: list[StepGate], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What another process's environment needs to hold its jobs at these gates (each
    gate its own job, or the same job at several steps)."""
    path = [str(SITE_DIR), *filter(None, [environ.get("PYTHONPATH")])]
    return {ENV: json.dumps([g._spec() for g in gates]), "PYTHONPATH": os.pathsep.join(path)}


class StepGates:
    """The gates of one test. Leaving the ``with`` block opens them all, so a job never
    outlives a failed test waiting at its gate."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._made: list[StepGate] = []

    def __call__(self, at_step: int, job_id: str | None = None, **options: Any) -> StepGate:
        gate = StepGate(self.folder / f"gate-{len(self._made)}", at_step, job_id, **options)
        self._made.append(gate)
        return gate

    def __enter__(self) -> StepGates:
        return self

    def __exit__(self, *exc: object) -> None:
        for gate in self._made:
            gate.open()
