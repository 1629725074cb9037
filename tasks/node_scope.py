"""What one host's per-node flows see of a backend: only the node they were given.

On a real host the backend already sees only that host's devices. The digital twin is one
fleet shared by every "host" of a cluster in a box, so a per-node `monitor` or `inventory`
(gpuflow.controlplane_nodes) narrows it to its node: nodes of other hosts are neither
sampled nor touched, and a request for one fails naming the node this view owns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuflow.hardware.backend import Backend, InvalidRequestError, NodeInfo
from gpuflow.tasks.worker_queues import owned_node


def check_node(node: str | None) -> str | None:
    """``node`` if this process may work on it: a worker that owns a node (GPUFLOW_NODE)
    works on that one only."""
    owned = owned_node()
    if node is not None and owned is not None and node != owned:
        raise InvalidRequestError(
            f"this worker owns node {owned!r}, not {node!r}: run it on {node!r}'s work queue"
        )
    return node


class _OnOwnNode:
    """A Backend method whose first argument is a node: refused for any node but the
    view's own, else the inner backend's."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, view: NodeView | None, owner: type | None = None) -> Any:
        if view is None:
            return self
        inner = getattr(view.inner, self.name)

        def on_own_node(node: str, *args: Any, **kwargs: Any) -> Any:
            if node != view.node:
                raise InvalidRequestError(f"node {node!r} is not this view's node {view.node!r}")
            return inner(node, *args, **kwargs)

        return on_own_node


class NodeView(Backend):
    """``backend`` limited to ``node``; anything else is passed through."""

    def __init__(self, backend: Backend, node: str) -> None:
        if node not in {n.name for n in backend.discover()}:
            raise InvalidRequestError(f"node {node!r} is not in the fleet of {backend.name!r}")
        self.inner = backend
        self.node = node
        self.name = backend.name

    def __getattr__(self, attr: str) -> Any:
        if attr == "inner":  # not set yet: no recursion
            raise AttributeError(attr)
        return getattr(self.inner, attr)  # backend extras, such as the twin's advance()

    def discover(self) -> list[NodeInfo]:
        return [n for n in self.inner.discover() if n.name == self.node]

    telemetry = _OnOwnNode()
    telemetry_fields = _OnOwnNode()
    energy_mj = _OnOwnNode()
    partition_profiles = _OnOwnNode()
    partitions = _OnOwnNode()
    gpu_instance_ids = _OnOwnNode()
    partition_mode = _OnOwnNode()
    partition_mode_state = _OnOwnNode()
    set_partition_mode = _OnOwnNode()
    device_processes = _OnOwnNode()
    create_partitions = _OnOwnNode()
    destroy_partitions = _OnOwnNode()
    clocks = _OnOwnNode()
    set_locked_clocks = _OnOwnNode()
    reset_locked_clocks = _OnOwnNode()
    set_applications_clocks = _OnOwnNode()
    power_limits = _OnOwnNode()
    set_power_limit_mw = _OnOwnNode()
    report_workload = _OnOwnNode()
    device_delay_s = _OnOwnNode()
    device_time_ratio = _OnOwnNode()

    def reset_devices(self, devices: Sequence[tuple[str, int]]) -> None:
        others = sorted({n for n, _ in devices} - {self.node})
        if others:
            raise InvalidRequestError(f"node(s) {others} are not this view's node {self.node!r}")
        self.inner.reset_devices(devices)

    def end_workload(self, owner: str) -> None:
        self.inner.end_workload(owner)

    def close(self) -> None:
        self.inner.close()


def node_backend(backend: Backend, node: str | None) -> Backend:
    """``backend`` as the flows of ``node`` see it (all of it when ``node`` is None)."""
    node = check_node(node)
    return backend if node is None else NodeView(backend, node)
