"""Choose a backend: GPUFLOW_BACKEND=auto|nvml|hygon|sim.

auto tries NVML (a driver that answers), then hy-smi on PATH, then the digital twin,
and says which it chose and why, so nobody wonders what they are looking at.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from pathlib import Path

from gpuflow.hardware.backend import Backend, InvalidRequestError

log = logging.getLogger(__name__)

BACKEND_NAMES = ("auto", "nvml", "hygon", "sim")


def backend_name_from_env() -> str:
    name = os.environ.get("GPUFLOW_BACKEND", "auto").strip().lower() or "auto"
    if name not in BACKEND_NAMES:
        raise InvalidRequestError(
            f"GPUFLOW_BACKEND={name!r} is not one of {', '.join(BACKEND_NAMES)}"
        )
    return name


def resolve_backend_name(name: str | None = None) -> tuple[str, str]:
    """(chosen backend, reason). ``name`` None reads GPUFLOW_BACKEND."""
    name = (name or backend_name_from_env()).lower()
    if name not in BACKEND_NAMES:
        raise InvalidRequestError(f"backend {name!r} is not one of {', '.join(BACKEND_NAMES)}")
    if name != "auto":
        return name, f"asked for {name}"
    from gpuflow.hardware import hygon, nvml

    ok, why = nvml.NvmlBackend.available()
    if ok:
        return "nvml", "auto: the NVIDIA driver answered NVML"
    ok_h, why_h = hygon.HygonBackend.available()
    if ok_h:
        return "hygon", f"auto: NVML unavailable ({why}); hy-smi found"
    return (
        "sim",
        f"auto: NVML unavailable ({why}); hy-smi unavailable ({why_h}); using the digital twin",
    )


def get_backend(name: str | None = None, spec_path: Path | None = None) -> Backend:
    """The backend for ``name`` (or GPUFLOW_BACKEND), logging which one and why.

    ``spec_path`` is the twin's fleet spec, used only when the twin is chosen.
    """
    chosen, reason = resolve_backend_name(name)
    log.info("gpuflow backend: %s (%s)", chosen, reason)
    if chosen == "nvml":
        return process_nvml_backend()
    if chosen == "hygon":
        from gpuflow.hardware.hygon import HygonBackend

        return HygonBackend()
    from gpuflow.hardware.sim import SimBackend

    return SimBackend(spec_path=spec_path)


_shared_lock = threading.Lock()
_shared: dict[int, Backend] = {}  # pid -> that process's NVML backend
_atexit_registered = False


def process_nvml_backend() -> Backend:
    """This process's one NVML backend: one nvmlInit and one XID event set kept from one
    monitor round to the next (a backend per call would register a new event set each
    time and miss the XIDs in between), shut down when the process exits. A forked child
    opens its own: NVML handles do not cross fork."""
    global _atexit_registered
    from gpuflow.hardware.nvml import NvmlBackend

    pid = os.getpid()
    with _shared_lock:
        backend = _shared.get(pid)
        if isinstance(backend, NvmlBackend) and not backend.closed:
            return backend
        _shared.clear()  # another pid's entry is a parent's: never use or close it here
        backend = NvmlBackend()
        _shared[pid] = backend
        if not _atexit_registered:
            atexit.register(close_process_backends)
            _atexit_registered = True
        return backend


def close_process_backends() -> None:
    """Close this process's shared NVML backend (at exit; tests call it too)."""
    with _shared_lock:
        backend = _shared.pop(os.getpid(), None)
        _shared.clear()
    if backend is not None:
        backend.close()
