"""NVML's error codes as this project's exceptions: one table, one decorator.

Every NVML call in this package is a direct attribute call on the pynvml module inside a
small method decorated with ``@nvml_call("what it does")``. The decorator turns
``pynvml.NVMLError`` into the HardwareError subclass ``NVML_ERRORS`` names for its code
and quotes NVML's message, the NVML function and where (``node`` or ``node:index``):

    gpu-node-1:0: reading power usage: nvmlDeviceGetPowerUsage failed: NVML: Unknown Error

Fields a device or driver may not offer are read through ``optional(default, method)``.
"""

from __future__ import annotations

import functools
import re
import types
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from gpuflow.hardware.backend import DeviceLostError, HardwareError, UnsupportedError


class NvmlFunctionNotFoundError(UnsupportedError):
    """The driver (NVML_ERROR_FUNCTION_NOT_FOUND) or nvidia-ml-py lacks the function."""


class NvmlInvalidArgumentError(HardwareError):
    """NVML_ERROR_INVALID_ARGUMENT: NVML refused an argument (e.g. an enum it does not know)."""


class NvmlNotFoundError(HardwareError):
    """NVML_ERROR_NOT_FOUND: nothing at that index or id (e.g. an empty MIG device slot)."""


class NvmlTimeoutError(HardwareError):
    """NVML_ERROR_TIMEOUT: nothing arrived in time (no event pending)."""


# NVML return code (the pynvml constant's name) -> (exception, hint added to the message).
# Codes not listed are a plain HardwareError. Names, not values, so that the injected module
# (a test fake) answers for the values.
NVML_ERRORS: dict[str, tuple[type[HardwareError], str]] = {
    "NVML_ERROR_GPU_IS_LOST": (DeviceLostError, " (the GPU fell off the bus?)"),
    "NVML_ERROR_NOT_SUPPORTED": (UnsupportedError, ""),
    "NVML_ERROR_FUNCTION_NOT_FOUND": (NvmlFunctionNotFoundError, " (the driver predates it)"),
    "NVML_ERROR_NO_PERMISSION": (HardwareError, " (this needs root)"),
    "NVML_ERROR_INVALID_ARGUMENT": (NvmlInvalidArgumentError, ""),
    "NVML_ERROR_NOT_FOUND": (NvmlNotFoundError, ""),
    "NVML_ERROR_TIMEOUT": (NvmlTimeoutError, ""),
}


def translate(nvml: Any, error: Exception, where: str, what: str, calls: str) -> HardwareError:
    """The exception for one NVMLError, its message quoting NVML's."""
    code = getattr(error, "value", None)
    cls, hint = HardwareError, ""
    for name, entry in NVML_ERRORS.items():
        if code == getattr(nvml, name, None):
            cls, hint = entry
            break
    return cls(f"{where}: {what}: {calls} failed: NVML: {error}{hint}")


class NvmlCaller(Protocol):
    """What the decorator needs of the object whose method it wraps."""

    @property
    def nvml(self) -> Any: ...  # the pynvml module, or a stand-in for tests

    @property
    def where(self) -> str: ...  # "node" or "node:index", for messages


_NVML_FUNCTION = re.compile(r"^nvml[A-Z]\w*$")  # pynvml's functions (constants: NVML_*)


def _nvml_names(code: types.CodeType) -> tuple[str, ...]:
    """The ``nvml*`` attribute names a method's code uses: the NVML functions it calls."""
    names = [n for n in code.co_names if _NVML_FUNCTION.match(n)]
    for const in code.co_consts:  # comprehensions and lambdas have their own code
        if isinstance(const, types.CodeType):
            names += _nvml_names(const)
    return tuple(dict.fromkeys(names))


S = TypeVar("S", bound=NvmlCaller)
P = ParamSpec("P")
R = TypeVar("R")
D = TypeVar("D")


def nvml_call(
    what: str,
) -> Callable[[Callable[Concatenate[S, P], R]], Callable[Concatenate[S, P], R]]:
    """Translate the NVMLErrors of a method that calls NVML; ``what`` says what it does.

    The message names the NVML function(s) the method calls, read once from its code, so
    no call is spelled twice. A function the installed nvidia-ml-py lacks (AttributeError
    on the module) is an NvmlFunctionNotFoundError, as a driver without it would be.
    """

    def decorate(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
        names = _nvml_names(method.__code__)

        @functools.wraps(method)
        def wrapper(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
            nvml = self.nvml
            try:
                return method(self, *args, **kwargs)
            except nvml.NVMLError as e:
                called = [n for n in names if callable(getattr(nvml, n, None))]
                raise translate(nvml, e, self.where, what, "/".join(called) or "NVML") from e
            except AttributeError as e:
                missing = [n for n in names if not hasattr(nvml, n)]
                if not missing:
                    raise
                raise NvmlFunctionNotFoundError(
                    f"{self.where}: {what}: this nvidia-ml-py has no {'/'.join(missing)}"
                ) from e

        return wrapper

    return decorate


def optional(default: D, read: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R | D:
    """``read(*args)``, or ``default`` when the device or driver does not offer the field.

    NOT_SUPPORTED (ECC off, no row remapping on a V100, utilization with MIG on) and a
    missing function give the default; any other error, a lost GPU included, propagates.
    """
    try:
        return read(*args, **kwargs)
    except UnsupportedError:
        return default
