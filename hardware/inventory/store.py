"""The Inventory: one object over the durable cluster state (see the package docstring)."""

from __future__ import annotations

from gpuflow.hardware.inventory.control import ControlMixin
from gpuflow.hardware.inventory.fleet import FleetMixin
from gpuflow.hardware.inventory.journal import JournalMixin
from gpuflow.hardware.inventory.leases import LeaseMixin
from gpuflow.hardware.inventory.lifecycle import LifecycleMixin
from gpuflow.hardware.inventory.locks import LockMixin
from gpuflow.hardware.inventory.maintenance import MaintenanceMixin
from gpuflow.hardware.inventory.progress import ProgressMixin
from gpuflow.hardware.inventory.settings import SettingsMixin
from gpuflow.hardware.inventory.snapshot import SnapshotMixin
from gpuflow.hardware.inventory.sync import SyncMixin


class Inventory(
    SyncMixin,
    FleetMixin,
    LeaseMixin,
    LockMixin,
    ControlMixin,
    MaintenanceMixin,
    LifecycleMixin,
    SettingsMixin,
    ProgressMixin,
    SnapshotMixin,
    JournalMixin,
):
    """Durable cluster state: nodes, devices, partitions, cordons, the spare pool, leases,
    the job control channel, the scheduler's pass lock and a jobs registry whose states
    only the lifecycle (lifecycle.py) moves; ``snapshot()`` reads what a scheduler pass
    needs of all that at once, and the change journal (``journal_since``) what changed
    since a pass last read it; and the device settings ledger (settings.py), which journals
    every power-limit and clock change energy control makes, so it can be put back; and
    each job's progress (progress.py), which an out-of-process energy controller times.

    ``Inventory()`` opens SQLite at GPUFLOW_HOME/inventory.db; ``Inventory(url)`` takes any
    SQLAlchemy URL (``postgresql+psycopg://...`` when several hosts share it). Tables are
    created on first use. ``now`` is the clock (seconds) used for leases and timestamps.
    Every method opens and ends its own transaction; every record returned is a detached
    frozen dataclass.
    """
