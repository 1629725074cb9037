"""The Inventory: one object over the durable cluster state (see the package docstring)."""

from __future__ import annotations

from gpuflow.hardware.inventory.control import ControlMixin
from gpuflow.hardware.inventory.fleet import FleetMixin
from gpuflow.hardware.inventory.jobs import JobsMixin
from gpuflow.hardware.inventory.leases import LeaseMixin
from gpuflow.hardware.inventory.sync import SyncMixin


class Inventory(SyncMixin, FleetMixin, LeaseMixin, ControlMixin, JobsMixin):
    """Durable cluster state: nodes, devices, partitions, cordons, the spare pool, leases,
    the job control channel and a jobs registry.

    ``Inventory()`` opens SQLite at GPUFLOW_HOME/inventory.db; ``Inventory(url)`` takes any
    SQLAlchemy URL (``postgresql+psycopg://...`` when several hosts share it). Tables are
    created on first use. ``now`` is the clock (seconds) used for leases and timestamps.
    Every method opens and ends its own transaction; every record returned is a detached
    frozen dataclass.
    """
