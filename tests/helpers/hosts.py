"""Two "hosts" on this machine for a test: a control host and a GPU host.

Where network namespaces can be made (root with CAP_SYS_ADMIN and iproute2), the GPU host
is a namespace of its own, joined to this test's namespace - the control host - by a veth
pair on a private /30: from there the control host is reachable only at its veth
address, as over a network. Elsewhere the two hosts are two loopback addresses (the
control host on 127.0.0.2), each with its own worker. ``Hosts.kind`` says which;
GPUFLOW_TEST_HOSTS=loopback asks for loopback addresses anyway (to try what CI without
namespaces runs).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

LOOPBACK_CONTROL = "127.0.0.2"  # the control host where no namespace can be made
FORCE_ENV = "GPUFLOW_TEST_HOSTS"


@dataclass(frozen=True)
class Hosts:
    kind: str  # "netns" or "loopback"
    control: str  # the control host's address
    gpu_prefix: tuple[str, ...]  # runs a command on the GPU host
    why: str  # for the loopback kind: why no namespace could be made


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", *args],  # noqa: S607 - iproute2 from PATH, fixed arguments
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _make_namespace(ns: str, veth_control: str, veth_gpu: str, control: str, gpu: str) -> str:
    """ "" when the GPU host's namespace and its link are up, else why not."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    for step in (
        ("netns", "add", ns),
        ("link", "add", veth_control, "type", "veth", "peer", "name", veth_gpu),
        ("link", "set", veth_gpu, "netns", ns),
        ("addr", "add", f"{control}/30", "dev", veth_control),
        ("link", "set", veth_control, "up"),
        ("-n", ns, "addr", "add", f"{gpu}/30", "dev", veth_gpu),
        ("-n", ns, "link", "set", veth_gpu, "up"),
        ("-n", ns, "link", "set", "lo", "up"),
        ("netns", "exec", ns, "true"),  # commands can run there (it mounts a /sys of its own)
    ):
        done = _ip(*step)
        if done.returncode != 0:
            return f"ip {' '.join(step)}: {done.stderr.strip()}"
    return ""


def _remove_namespace(ns: str, veth_control: str) -> None:
    if shutil.which("ip") is not None:
        _ip("netns", "del", ns)  # takes both ends of the veth pair with it
        _ip("link", "del", veth_control)  # in case it never moved


@contextlib.contextmanager
def two_hosts() -> Iterator[Hosts]:
    """The two hosts for the duration of the block; the namespace and the veth pair
    are removed after it."""
    tag = os.getpid() % 100_000
    ns, veth_control, veth_gpu = f"gpuflow-gpu-{tag}", f"gfc{tag}", f"gfg{tag}"
    subnet = f"10.254.{tag % 250 + 1}"
    control, gpu = f"{subnet}.1", f"{subnet}.2"
    if os.environ.get(FORCE_ENV) == "loopback":
        why = f"{FORCE_ENV}=loopback"
    else:
        why = _make_namespace(ns, veth_control, veth_gpu, control, gpu)
    if why:
        _remove_namespace(ns, veth_control)
        yield Hosts("loopback", LOOPBACK_CONTROL, (), why)
        return
    try:
        yield Hosts("netns", control, ("ip", "netns", "exec", ns), "")
    finally:
        _remove_namespace(ns, veth_control)
