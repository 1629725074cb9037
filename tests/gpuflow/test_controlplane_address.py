"""`gpuflow up --host`: which address the servers bind and which one their URLs name."""

from __future__ import annotations

import socket

import pytest
from gpuflow.hardware.backend import InvalidRequestError

from gpuflow import controlplane_address
from gpuflow.controlplane import local_urls
from gpuflow.controlplane_address import check_port, listen_address


def test_an_ip_address_is_bound_and_named_as_given() -> None:
    address = listen_address("127.0.0.2")
    assert (address.bind, address.advertised, address.is_loopback) == (
        "127.0.0.2",
        "127.0.0.2",
        True,
    )
    assert local_urls(4200, 5000, address) == {
        "prefect_api_url": "http://127.0.0.2:4200/api",
        "prefect_ui_url": "http://127.0.0.2:4200",
        "mlflow_url": "http://127.0.0.2:5000",
    }
    assert local_urls()["prefect_api_url"] == "http://127.0.0.1:4200/api"  # the default


def test_an_ipv6_literal_goes_into_urls_in_brackets() -> None:
    address = listen_address("::1")
    assert address.family == socket.AF_INET6
    assert address.url(5000) == "http://[::1]:5000"
    # MLflow matches Host headers with fnmatch, where "[" opens a character class.
    assert "[[]::1]:*" in address.allowed_host_headers.split(",")


def test_a_name_binds_what_it_resolves_to_and_urls_keep_the_name() -> None:
    address = listen_address("localhost")
    assert address.advertised == "localhost"
    assert address.bind in {"127.0.0.1", "::1"} and address.is_loopback
    headers = address.allowed_host_headers.split(",")
    assert "localhost" in headers and "localhost:*" in headers


def test_a_wildcard_binds_everything_and_names_the_default_route_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The probe is only routed, never sent: aimed at loopback, the answer is known.
    monkeypatch.setattr(controlplane_address, "_ROUTE_PROBE", ("127.0.0.1", 9))
    address = listen_address("0.0.0.0")  # noqa: S104 - what the test is about
    assert (address.bind, address.advertised) == ("0.0.0.0", "127.0.0.1")  # noqa: S104
    assert address.url(4200, "/api") == "http://127.0.0.1:4200/api"


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ("", "--host is empty"),
        ("no-such-host.invalid", "'no-such-host.invalid' is neither an IP address nor a name"),
    ],
)
def test_a_bad_host_is_refused_by_name(host: str, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        listen_address(host)


def test_ports_are_checked_on_the_address_itself() -> None:
    address = listen_address("127.0.0.2")
    with socket.socket() as taken:
        taken.bind(("127.0.0.2", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InvalidRequestError, match=f"port {port} on 127.0.0.2 cannot be bound"):
            check_port(address, port)
        # The same port on another address of this machine is free.
        assert check_port(listen_address("127.0.0.3"), port) == port
    assert 1 <= check_port(address, 0) <= 65535
    with pytest.raises(InvalidRequestError, match="port 70000 is not in 1..65535"):
        check_port(address, 70000)


def test_an_address_of_another_machine_cannot_be_bound() -> None:
    # TEST-NET-3 (RFC 5737): never an address of this machine.
    with pytest.raises(InvalidRequestError, match="port 4200 on 203.0.113.7 cannot be bound"):
        check_port(listen_address("203.0.113.7"), 4200)
