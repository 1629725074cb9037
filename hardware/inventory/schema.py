"""The inventory's tables (SQLAlchemy Core), portable between SQLite and PostgreSQL.

Identity choices that matter under failure:
- a device is its uuid, not its (node, index): NVML renumbers the survivors when a GPU
  falls off the bus, and leases, cordons and history must stay with the physical part.
  (node, index) is unique only among present devices (a partial unique index).
- a lease row is keyed by the resource id, so "two holders of one resource" cannot be
  written at all; takeover of an expired lease is a compare-and-swap update.
- a lease belongs to (owner, attempt) and carries a fencing token drawn from one
  store-wide counter (gf_counters), so a newer holder always has a larger token.
- a job row's (state, attempt) is what every lifecycle write compares and swaps.
- times are float seconds from the inventory's clock (injectable for tests).

- every change a scheduler decides on (a job row, a lease's holder, the fleet's shape) is
  appended to gf_changes by triggers in the database itself (journal.py), so a reader can
  follow what changed since its last read without trusting every writer to say so.

SCHEMA_VERSION 2 added jobs.attempt, leases.attempt/token, gf_counters and gf_locks;
SCHEMA_VERSION 3 added gf_changes and its triggers. engine.migrate brings older databases
up to date.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    true,
)

SCHEMA_VERSION = 3
NODE_CORDON = ""  # device_uuid of a cordon that covers the whole node

metadata = MetaData()

meta = Table(
    "gf_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(255), nullable=False),
)

nodes = Table(
    "gf_nodes",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("region", String(255), nullable=False),
    Column("role", String(16), nullable=False),
    Column("backend", String(64), nullable=False),
    Column("first_seen", Float, nullable=False),
    Column("last_seen", Float, nullable=False),
)

devices = Table(
    "gf_devices",
    metadata,
    Column("uuid", String(255), primary_key=True),
    Column("node", String(255), ForeignKey("gf_nodes.name"), nullable=False),
    Column("device_index", Integer, nullable=False),
    Column("vendor", String(32), nullable=False),
    Column("sku", String(255), nullable=False),
    Column("memory_total_mb", Integer, nullable=False),
    Column("pci_device_id", String(32), nullable=True),
    Column("partition_kinds", String(64), nullable=False, default=""),
    Column("present", Boolean, nullable=False),
    Column("healthy", Boolean, nullable=False),
    Column("health_reason", Text, nullable=True),
    Column("telemetry", JSON, nullable=True),
    Column("telemetry_at", Float, nullable=True),
    Column("last_seen", Float, nullable=False),
)
Index("ix_gf_devices_node", devices.c.node, devices.c.device_index)
Index(
    "uq_gf_devices_present_slot",
    devices.c.node,
    devices.c.device_index,
    unique=True,
    sqlite_where=devices.c.present == true(),
    postgresql_where=devices.c.present == true(),
)

partitions = Table(
    "gf_partitions",
    metadata,
    Column("uuid", String(255), primary_key=True),
    Column("device_uuid", String(255), ForeignKey("gf_devices.uuid"), nullable=False),
    Column("profile", String(64), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("memory_mb", Integer, nullable=False),
    Column("compute_units", Integer, nullable=True),
    Column("placement_start", Integer, nullable=True),
    Column("placement_size", Integer, nullable=True),
)
Index("ix_gf_partitions_device", partitions.c.device_uuid)

leases = Table(
    "gf_leases",
    metadata,
    Column("resource_id", String(255), primary_key=True),
    Column("owner", String(255), nullable=False),
    Column("acquired_at", Float, nullable=False),
    Column("renewed_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("attempt", Integer, nullable=False, server_default="0"),
    Column("token", Integer, nullable=False, server_default="0"),
)
Index("ix_gf_leases_owner", leases.c.owner)
Index("ix_gf_leases_expires", leases.c.expires_at)

cordons = Table(
    "gf_cordons",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", String(255), ForeignKey("gf_nodes.name"), nullable=False),
    Column("device_uuid", String(255), nullable=False),  # NODE_CORDON for the whole node
    Column("reason", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    UniqueConstraint("node", "device_uuid", name="uq_gf_cordons_target"),
)

control_requests = Table(
    "gf_control_requests",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(255), nullable=False),
    Column("action", String(32), nullable=False),
    Column("status", String(16), nullable=False),
    Column("requested_at", Float, nullable=False),
    Column("acked_at", Float, nullable=True),
    Column("checkpoint_id", String(255), nullable=True),
)
# The training loop polls (job_id, pending) every step: keep that an index lookup.
Index("ix_gf_control_poll", control_requests.c.job_id, control_requests.c.status)

jobs = Table(
    "gf_jobs",
    metadata,
    Column("job_id", String(255), primary_key=True),
    Column("spec", JSON, nullable=False),
    Column("state", String(16), nullable=False),
    Column("resource_ids", JSON, nullable=False),
    Column("last_checkpoint_id", String(255), nullable=True),
    Column("info", JSON, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("attempt", Integer, nullable=False, server_default="0"),
)
Index("ix_gf_jobs_state", jobs.c.state)

# Named counters that only grow: fencing tokens ("fence") and job sequence numbers.
counters = Table(
    "gf_counters",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", Integer, nullable=False),
)

# Fleet-wide locks (the scheduler's pass lock): one row per lock, taken by INSERT or by a
# compare-and-swap over an expired row, like a lease.
locks = Table(
    "gf_locks",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("holder", String(255), nullable=False),
    Column("token", Integer, nullable=False),
    Column("acquired_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
)

# The change journal: one row per changed job, lease holder or piece of the fleet, written
# by triggers (journal.py). ``rev`` only grows; SQLite's AUTOINCREMENT never reuses one.
changes = Table(
    "gf_changes",
    metadata,
    Column("rev", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("entity", String(16), nullable=False),  # job | lease | fleet
    Column("key", String(255), nullable=False),  # job id, resource id, node or device uuid
    sqlite_autoincrement=True,
)

# The device settings ledger (settings.py): what energy control changed on a device and what
# to put back. One row per device slot, so "two holders changing one device" cannot be
# written; ``version`` is what every takeover, rewind and release compares and swaps. A
# column pair left NULL in applied_* is a setting the holder did not touch; NULL in
# original_locked_* / original_applications_* means "none was set" (restore resets them).
# A new table: create_all makes it in an older database, no schema version step needed.
device_settings = Table(
    "gf_device_settings",
    metadata,
    Column("node", String(255), primary_key=True),
    Column("device_index", Integer, primary_key=True),
    Column("device_uuid", String(255), nullable=True),
    Column("holder", String(255), nullable=False),
    Column("taken_from", String(255), nullable=True),  # whose change a restorer undoes
    Column("original_power_limit_mw", Integer, nullable=True),
    Column("applied_power_limit_mw", Integer, nullable=True),
    Column("original_locked_min_mhz", Integer, nullable=True),
    Column("original_locked_max_mhz", Integer, nullable=True),
    Column("applied_locked_min_mhz", Integer, nullable=True),
    Column("applied_locked_max_mhz", Integer, nullable=True),
    Column("original_applications_mem_mhz", Integer, nullable=True),
    Column("original_applications_sm_mhz", Integer, nullable=True),
    Column("applied_applications_mem_mhz", Integer, nullable=True),
    Column("applied_applications_sm_mhz", Integer, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("version", Integer, nullable=False),
)
Index("ix_gf_device_settings_holder", device_settings.c.holder)
