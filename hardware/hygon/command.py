"""Running ``hy-smi``: argv lists (never a shell string), a timeout, and its ``-h`` flags.

Arguments are checked to be strings before anything starts; a non-zero exit becomes a
HardwareError that names the command and quotes both streams.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from gpuflow.hardware.backend import HardwareError, InvalidRequestError, UnsupportedError
from gpuflow.hardware.hygon import parse as hp


def is_int(value: Any) -> bool:
    """An int that is not a bool: ids, sizes and clocks are checked with this."""
    return isinstance(value, int) and not isinstance(value, bool)


def status_error(proc: subprocess.CompletedProcess[str]) -> HardwareError:
    """The error for a hy-smi run that exited non-zero."""
    shown = " ".join(str(a) for a in proc.args)
    return HardwareError(
        f"`{shown}` exited with status {proc.returncode}: "
        f"stderr {hp.quote(proc.stderr)}, stdout {hp.quote(proc.stdout)}"
    )


class HySmi:
    """One hy-smi executable (a path or a name on PATH), run with a timeout per call."""

    def __init__(self, executable: str, timeout_s: float) -> None:
        if not isinstance(executable, str) or not executable.strip():
            raise InvalidRequestError(
                f"executable must be a non-empty path or name, got {executable!r}"
            )
        if not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool) or timeout_s <= 0:
            raise InvalidRequestError(f"timeout_s must be a positive number, got {timeout_s!r}")
        self.executable = executable
        self.timeout_s = float(timeout_s)
        self._help: frozenset[str] | None = None

    def resolve(self) -> str:
        path = shutil.which(self.executable)
        if path is None:
            raise HardwareError(
                f"hy-smi executable {self.executable!r} not found (is the DCU driver installed?)"
            )
        return path

    def run(self, args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run hy-smi with ``args`` (an argv list, no shell); non-zero exit raises if check."""
        if not all(isinstance(a, str) for a in args):
            raise InvalidRequestError(f"hy-smi arguments must be strings, got {list(args)!r}")
        argv = [self.resolve(), *args]
        shown = " ".join(argv)
        try:
            # argv list, fixed executable, validated arguments: no shell is involved.
            proc = subprocess.run(  # noqa: S603
                argv,
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,  # a confirmation prompt fails instead of hanging
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise HardwareError(
                f"`{shown}` timed out after {self.timeout_s:g} s; output so far {hp.quote(exc.stdout)}"
            ) from None
        except OSError as exc:
            raise HardwareError(f"`{shown}` could not start: {exc}") from None
        if check and proc.returncode != 0:
            raise status_error(proc)
        return proc

    def help_flags(self) -> frozenset[str]:
        """The options ``hy-smi -h`` lists (cached; empty when -h fails)."""
        if self._help is None:
            proc = self.run(["-h"], check=False)
            self._help = (
                hp.parse_help_flags(proc.stdout + "\n" + proc.stderr)
                if proc.returncode == 0
                else frozenset()
            )
        return self._help

    def forget_help(self) -> None:
        self._help = None

    def require_flags(self, what: str, *flags: str) -> None:
        """UnsupportedError naming the flags ``-h`` does not list (the setters are optional)."""
        have = self.help_flags()
        missing = [f for f in flags if f not in have]
        if missing:
            raise UnsupportedError(
                f"{what} needs hy-smi option(s) {', '.join(missing)}, which `{self.executable} -h` "
                "does not list on this driver"
            )
