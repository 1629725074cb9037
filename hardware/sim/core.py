"""The twin's state plumbing, shared by every SimBackend call: construction, one
transaction per call, reset, and device lookups.

Every call is one transaction on the shared state (hardware.sim.state): lock, read, run
every device forward to the present (hardware.sim.fleet), validate, change, write. So
separate processes - a flow, a monitor, the CLI - see one fleet, and a request that is
rejected changes nothing. The SimBackend facets (partitions_api, clocks_api, tenants_api,
faults_api) build on SimCore; backend.SimBackend composes them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuflow.hardware.backend import (
    Backend,
    DeviceLostError,
    HardwareError,
    InvalidRequestError,
)
from gpuflow.hardware.home import gpuflow_home
from gpuflow.hardware.sim import clock as simclock
from gpuflow.hardware.sim import fleet
from gpuflow.hardware.sim.cluster_spec import ClusterSpec, load_cluster_spec
from gpuflow.hardware.sim.state import StateStore


def _canonical(d: dict[str, Any]) -> Any:
    return json.loads(json.dumps(d, sort_keys=True))


def is_number(v: object) -> bool:
    """An int or float, not a bool (JSON/YAML input may carry either)."""
    return isinstance(v, int | float) and not isinstance(v, bool)


def is_int(v: object) -> bool:
    """An int, not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


class SimCore(Backend):
    """The twin's state and lookups; see SimBackend for construction arguments."""

    def __init__(self, home: Path | None = None, spec_path: Path | None = None) -> None:
        self.home = Path(home) if home is not None else gpuflow_home()
        self.state_dir = self.home / "twin"
        self._store = StateStore(self.state_dir)
        self._spec_path = Path(spec_path) if spec_path is not None else None
        # Per-instance XID cursors, like an NVML event set is per process.
        self._xid_cursor: dict[tuple[str, str, int], int] = {}
        spec = load_cluster_spec(self._spec_path) if self._spec_path is not None else None
        with self._store.locked():
            try:
                state = self._store.read()
            except HardwareError:
                return  # corrupt: every call will say so, and reset() still works
            if state is None:
                self._store.write(fleet.new_state(spec or load_cluster_spec(None)))
                return
            if state.get("version") != fleet.STATE_VERSION:
                return  # every call will say so, and reset() still works
            # Through from_dict: a state from before a spec field existed compares with
            # that field's default.
            if spec is not None and _canonical(spec.to_dict()) != _canonical(
                ClusterSpec.from_dict(state["spec"]).to_dict()
            ):
                raise HardwareError(
                    f"the twin in {self.state_dir} was created from {state['spec_source']} "
                    f"(cluster {state['spec']['name']!r}); {self._spec_path} describes a "
                    f"different fleet. To start over from it: "
                    f"SimBackend(home).reset(spec_path={str(self._spec_path)!r}) "
                    f"(or `gpuflow sim reset --spec {self._spec_path}`)"
                )

    # -- state plumbing ----------------------------------------------------------------

    def _check_version(self, state: dict[str, Any]) -> None:
        if state.get("version") != fleet.STATE_VERSION:
            raise HardwareError(
                f"the twin state in {self.state_dir} has version {state.get('version')!r}, "
                f"this code reads version {fleet.STATE_VERSION}; reset the twin "
                "(SimBackend(home).reset())"
            )

    def _create(self) -> dict[str, Any]:
        return fleet.new_state(load_cluster_spec(self._spec_path))

    @contextlib.contextmanager
    def _txn(self) -> Iterator[tuple[dict[str, Any], float]]:
        """The state, run forward to now; written back unless the block raises."""
        with self._store.transaction(self._create) as state:
            self._check_version(state)
            now = simclock.now_s(state["clock"])
            fleet.sync_all(state, now)
            yield state, now

    def reset(self, spec_path: Path | None = None) -> None:
        """Re-create the twin from ``spec_path`` (None: the packaged default fleet)."""
        self.reset_state(spec_path, self.home)
        self._spec_path = Path(spec_path) if spec_path is not None else None
        self._xid_cursor.clear()

    @classmethod
    def reset_state(cls, spec_path: Path | None = None, home: Path | None = None) -> None:
        """Re-create the twin in ``home`` (GPUFLOW_HOME) without opening the old state."""
        spec = load_cluster_spec(Path(spec_path) if spec_path is not None else None)
        store = StateStore((Path(home) if home is not None else gpuflow_home()) / "twin")
        with store.locked():
            store.write(fleet.new_state(spec))

    # -- lookups -----------------------------------------------------------------------

    @staticmethod
    def _known_devices(state: dict[str, Any]) -> str:
        per_node: dict[str, list[int]] = {}
        for d in state["devices"].values():
            per_node.setdefault(d["node"], []).append(d["index"])
        return ", ".join(f"{n}:{min(ix)}..{max(ix)}" for n, ix in per_node.items())

    def _dev(self, state: dict[str, Any], node: str, index: int) -> dict[str, Any]:
        dev = state["devices"].get(fleet.device_key(str(node), index)) if is_int(index) else None
        if dev is None:
            raise InvalidRequestError(
                f"no device {node}:{index} in the twin; devices: {self._known_devices(state)}"
            )
        return dev

    def _live(self, state: dict[str, Any], node: str, index: int) -> dict[str, Any]:
        dev = self._dev(state, node, index)
        if dev["health"] == "lost":
            raise DeviceLostError(
                f"{node}:{index} ({dev['uuid']}) fell off the bus (XID 79); repair it"
            )
        return dev

    @staticmethod
    def _label(dev: dict[str, Any]) -> str:
        return f"{dev['node']}:{dev['index']} ({dev['sku']})"
