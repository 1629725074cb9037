"""What the `gpuflow` verbs of cli.py, cli_hw.py and cli_train.py share: the consoles, clean
errors for refused input, and the --backend option."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from gpuflow.hardware.backend import Backend, HardwareError, InvalidRequestError

# Piped output (CI logs, `| less`) gets a table wide enough for nvidia-smi-like rows.
console = Console(width=None if Console().is_terminal else 160)
err_console = Console(stderr=True, soft_wrap=True)  # errors stay one greppable line

F = TypeVar("F", bound=Callable[..., Any])


def clean_errors(fn: F | None = None, *, hardware_exit: int = 1) -> Any:
    """Bad input and refused operations end as one red line and a non-zero exit, not a
    trace: 2 for bad input, ``hardware_exit`` for a hardware error (a command whose exit 1
    means something else, like `assert`'s "does not match", gives it 2)."""

    def decorate(fn: F) -> F:
        @wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except InvalidRequestError as exc:
                err_console.print(f"[red]error:[/red] {exc}")
                raise typer.Exit(2) from None
            except HardwareError as exc:
                err_console.print(f"[red]hardware error:[/red] {exc}")
                raise typer.Exit(hardware_exit) from None

        return wrapper  # type: ignore[return-value]

    return decorate(fn) if fn is not None else decorate


BackendOpt = Annotated[
    str | None,
    typer.Option(
        "--backend", "-b", help="auto | nvml | hygon | sim (default: GPUFLOW_BACKEND or auto)"
    ),
]


def backend_named(name: str | None) -> Backend:
    """The backend of --backend (or GPUFLOW_BACKEND, or auto); says on stderr which and why."""
    from gpuflow.hardware.select import get_backend, resolve_backend_name

    chosen, reason = resolve_backend_name(name)
    err_console.print(f"[dim]backend: {chosen} ({reason})[/dim]")
    return get_backend(chosen)


def spec_from_options(spec_class: type, **fields: Any) -> Any:
    """A job spec from CLI options (None: the spec's default); every validation error,
    named by its field, as one clean refusal before anything runs."""
    from pydantic import ValidationError

    try:
        return spec_class(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        msgs = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidRequestError(msgs) from None
