"""What the NVML backend tests share: the fake, a backend on it, MIG switched on."""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
from gpuflow.hardware import nvml as nvml_package
from gpuflow.hardware.backend import PartitionRequest
from gpuflow.hardware.nvml import NvmlBackend

from tests.hardware.nvml.fake_pynvml import FakeNvml

__all__ = [
    "ENABLE",
    "NODE",
    "CallSite",
    "FakeNvml",
    "R",
    "backend",
    "backend_class_on",
    "backend_nvml_calls",
    "load_script",
    "mig_on",
]

NODE = "gpu-node-1"
ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE


def backend(fake: FakeNvml, **kw) -> NvmlBackend:
    return NvmlBackend(node_name=NODE, nvml=fake, **kw)


def backend_class_on(fake: FakeNvml) -> type[NvmlBackend]:
    """NvmlBackend as a script constructs it (no arguments), its NVML the fake."""

    class OnFake(NvmlBackend):
        def __init__(self) -> None:
            super().__init__(node_name=NODE, nvml=fake)

        @classmethod
        def available(cls, nvml=None):
            return NvmlBackend.available(nvml=fake)

    return OnFake


def load_script(name: str) -> Any:
    """scripts/<name>.py as a module of its own (scripts/ is not a package)."""
    path = Path(__file__).resolve().parents[3] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def mig_on(fake: FakeNvml, *indexes: int) -> None:
    for i in indexes:
        fake.device(i).mig_current = fake.device(i).mig_pending = ENABLE


def R(profile: str, start: int | None = None) -> PartitionRequest:
    return PartitionRequest(profile=profile, placement_start=start)


@dataclass(frozen=True)
class CallSite:
    """One call of a pynvml function in hardware/nvml/, read from the source."""

    where: str  # "device.py:67"
    name: str  # "nvmlDeviceGetPowerUsage"
    positional: int  # how many positional arguments it passes
    keywords: tuple[str, ...]
    in_nvml_call: bool  # inside a method decorated with @nvml_call(...)


_NVML_FUNCTION = re.compile(r"^nvml[A-Z]\w*$")  # pynvml's functions; constants are NVML_*


def _is_nvml_call_decorator(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "nvml_call"
    )


def backend_nvml_calls() -> list[CallSite]:
    """Every call ``<something>.nvmlXxx(...)`` in the modules of hardware/nvml/."""
    sites: dict[tuple[str, int, int], CallSite] = {}
    for path in sorted(Path(nvml_package.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        scopes = [(tree, False)] + [
            (fn, any(_is_nvml_call_decorator(d) for d in fn.decorator_list))
            for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        for scope, decorated in scopes:
            for node in ast.walk(scope):
                if not (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and _NVML_FUNCTION.match(node.func.attr)
                ):
                    continue
                key = (path.name, node.lineno, node.col_offset)
                seen = sites.get(key)
                sites[key] = CallSite(
                    where=f"{path.name}:{node.lineno}",
                    name=node.func.attr,
                    positional=len(node.args),
                    keywords=tuple(k.arg or "**" for k in node.keywords),
                    in_nvml_call=decorated or (seen is not None and seen.in_nvml_call),
                )
    return list(sites.values())
