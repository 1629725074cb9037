"""Holds a training job of this process at the test's step gate (tests/helpers/step_gate.py).

Python imports ``sitecustomize`` at start from PYTHONPATH; ``StepGate.env()`` puts this
folder there only for processes a test starts (a control plane's workers and their flow
runs). With the gate's variable set, the gate joins ``tasks.training.control.step_observers``
when that module is first imported; without it this file does nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

_TARGET = "gpuflow.tasks.training.control"
_GATE_FILE = Path(__file__).resolve().parents[1] / "step_gate.py"


def _gate_observers() -> list[Any]:
    spec = importlib.util.spec_from_file_location("_gpuflow_test_step_gate", _GATE_FILE)
    assert spec is not None and spec.loader is not None, _GATE_FILE
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves annotations through it
    spec.loader.exec_module(module)
    return [gate.observer for gate in module.StepGate.all_from_env()]


class _AddGateOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it wraps the real loader of the training control module so the
    gate is added right after that module runs."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)  # once, and never in the way of the real finders
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        run_module = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run_module(module)
            module.step_observers.extend(_gate_observers())

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("GPUFLOW_TEST_STEP_GATE"):
    sys.meta_path.insert(0, _AddGateOnImport())
