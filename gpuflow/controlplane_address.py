"""Where a control plane listens (`gpuflow up --host ADDR`) and the address clients use.

The servers bind ``ADDR``. Clients (workers on this host and on others, the UIs) are
given URLs that name it, except for a wildcard (0.0.0.0, ::), which no client can
connect to: its URLs name the address of the interface that holds the default route,
the one other hosts most likely reach this machine by.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.tasks.telemetry.settings import resolve_host

LOOPBACK = "127.0.0.1"
# Any address outside this machine works: connecting a UDP socket sends nothing, it only
# picks the local address the kernel would route through (TEST-NET-1, RFC 5737).
_ROUTE_PROBE = ("192.0.2.1", 9)
_ROUTE_PROBE_V6 = ("2001:db8::1", 9)


@dataclass(frozen=True)
class ListenAddress:
    """``bind``: what the servers listen on; ``advertised``: what URLs name."""

    bind: str
    advertised: str
    family: socket.AddressFamily

    @property
    def url_host(self) -> str:
        """``advertised`` as it goes into a URL (an IPv6 literal in brackets)."""
        return f"[{self.advertised}]" if ":" in self.advertised else self.advertised

    def url(self, port: int, path: str = "") -> str:
        return f"http://{self.url_host}:{port}{path}"

    @property
    def is_loopback(self) -> bool:
        """Only this machine reaches the servers (``bind`` is always an IP address)."""
        return ipaddress.ip_address(self.bind).is_loopback

    @property
    def allowed_host_headers(self) -> str:
        """Host headers the MLflow server accepts (MLFLOW_SERVER_ALLOWED_HOSTS; it refuses
        others against DNS rebinding): loopback names and the advertised address."""
        names = dict.fromkeys(["localhost", "127.0.0.1", "[::1]", self.url_host])
        # With a port the entry is an fnmatch pattern, where "[" opens a character class.
        return ",".join(f"{n},{n.replace('[', '[[]', 1)}:*" for n in names)


def listen_address(host: str) -> ListenAddress:
    """Validate ``host`` (an IP literal or a name this machine resolves) before anything
    starts; the error names it."""
    host = host.strip()
    if not host:
        raise InvalidRequestError("--host is empty; give an IP address or a host name")
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        ip = None
    if ip is None:
        family, bind = resolve_host(host)  # the exporter's --host resolves the same way
        return ListenAddress(bind=bind, advertised=host, family=family)
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    bind = str(ip)
    if not ip.is_unspecified:
        return ListenAddress(bind=bind, advertised=bind, family=family)
    return ListenAddress(bind=bind, advertised=_default_route_address(family), family=family)


def _default_route_address(family: socket.AddressFamily) -> str:
    probe = _ROUTE_PROBE_V6 if family == socket.AF_INET6 else _ROUTE_PROBE
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(probe)
            return str(s.getsockname()[0])
    except OSError:
        raise InvalidRequestError(
            "--host binds every interface, but this machine has no default route to tell "
            "other hosts which address to use; pass --host with that address instead"
        ) from None


def free_port(address: ListenAddress) -> int:
    with socket.socket(address.family) as s:
        s.bind((address.bind, 0))
        return int(s.getsockname()[1])


def check_port(address: ListenAddress, port: int) -> int:
    """``port`` if the servers can bind it on ``address`` (0: any free one)."""
    if port == 0:
        return free_port(address)
    if not 1 <= port <= 65535:
        raise InvalidRequestError(f"port {port} is not in 1..65535")
    with socket.socket(address.family) as s:
        try:
            s.bind((address.bind, port))
        except OSError as exc:
            raise InvalidRequestError(
                f"port {port} on {address.bind} cannot be bound ({exc.strerror}); pick "
                "another (--prefect-port/--mlflow-port/--exporter-port, 0 = any) or another "
                "--host"
            ) from None
    return port
