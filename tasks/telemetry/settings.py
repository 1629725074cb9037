"""The exporter's settings and how each flag is checked, apart from the exporter itself so
the CLI and `gpuflow up` check them (before anything starts) without importing the
health model's torch."""

from __future__ import annotations

import socket

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.tasks.health.sampler import MIN_INTERVAL_S, validate_interval_s

# Beside dcgm-exporter's 9400 (a host may run both while it moves over), not on it.
DEFAULT_PORT = 9450
DEFAULT_HOST = "127.0.0.1"
# In the exporter's error when its port is taken: `gpuflow up` retries another on seeing it.
PORT_TAKEN = "cannot be bound"


def validate_exporter_interval(interval_s: float) -> float:
    """--interval-s, refused below 5 s with the reason (before anything starts)."""
    try:
        return validate_interval_s(interval_s)
    except ValueError as exc:
        raise InvalidRequestError(f"--interval-s {interval_s!r}: {exc}") from None


def validate_port(port: int) -> int:
    """--port: 0 (any free one, for tests) or 1..65535."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidRequestError(f"--port {port!r} is not in 0..65535 (0: any free port)")
    return port


def resolve_host(host: str) -> tuple[socket.AddressFamily, str]:
    """(address family, address) the server binds for --host: an IP address or a name
    this machine resolves; refused naming it otherwise."""
    text = host.strip().strip("[]")
    if not text:
        raise InvalidRequestError("--host is empty; give an IP address or a host name")
    try:
        infos = socket.getaddrinfo(text, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise InvalidRequestError(
            f"--host {host!r} is neither an IP address nor a name this machine resolves ({exc})"
        ) from None
    family, *_rest, sockaddr = infos[0]
    return family, str(sockaddr[0])


__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "MIN_INTERVAL_S",
    "resolve_host",
    "validate_exporter_interval",
    "validate_port",
]
