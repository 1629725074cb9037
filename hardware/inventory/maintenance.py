"""Taking devices out of service for a layout change, and what the change invalidates.

A partition apply destroys every partition of a device it changes, so it may only touch
devices nothing holds. ``reserve_devices`` checks that and cordons them in one write
transaction: a lease taken before it is seen (and refuses the change), a lease asked for
after it meets the cordon. Either way no lease and no partition apply share a device.
``release_devices`` lifts only the cordons the reservation made (a health cordon that
was there, or arrived meanwhile, stays). ``invalidate_vanished`` requeues jobs whose
placement names a device or partition that no longer exists: after a repartition, a MIG
UUID in a queued ``CUDA_VISIBLE_DEVICES`` would point at nothing, or at someone else.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuflow.hardware.backend import DeviceBusyError, InvalidRequestError
from gpuflow.hardware.inventory import schema
from gpuflow.hardware.inventory.lifecycle import ACTIVE_STATES, LifecycleMixin
from gpuflow.hardware.inventory.records import (
    IllegalTransitionError,
    JobConflictError,
    JobRecord,
    JobState,
)
from sqlalchemy import Connection, delete, insert, select


class MaintenanceMixin(LifecycleMixin):
    def reserve_devices(
        self, devices: Sequence[tuple[str, int]], reason: str
    ) -> list[tuple[str, int]]:
        """Cordon ``devices`` for a change, or raise DeviceBusyError naming every live lease
        on them or their partitions (nothing cordoned then). Returns the devices this call
        cordoned; one already cordoned keeps its cordon and reason."""
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidRequestError("a reservation needs a reason (who changes what)")
        wanted = list(dict.fromkeys((str(n), i) for n, i in devices))

        def work(conn: Connection) -> list[tuple[str, int]]:
            now = self._clock()
            p_t, l_t = schema.partitions, schema.leases
            rows = [self._device_row(conn, n, i) for n, i in wanted]
            # Lock the device rows before reading their leases: a lease being taken on
            # them holds them FOR SHARE (leases.py), so one of the two waits for the other
            # and then sees its cordon or its lease (no write skew on PostgreSQL).
            d_t = schema.devices
            conn.execute(
                select(d_t.c.uuid).where(d_t.c.uuid.in_([r.uuid for r in rows])).with_for_update()
            ).all()
            busy: dict[str, list[str]] = {}
            for row in rows:
                parts = conn.execute(
                    select(p_t.c.uuid).where(p_t.c.device_uuid == row.uuid)
                ).scalars()
                ids = [row.uuid, *parts]
                for lease in conn.execute(select(l_t).where(l_t.c.resource_id.in_(ids))):
                    if lease.expires_at > now:
                        busy.setdefault(f"{row.node}:{row.device_index}", []).append(
                            f"lease of {lease.owner!r} on {lease.resource_id}"
                        )
            if busy:
                raise DeviceBusyError(busy)
            made = []
            for row in rows:
                if self._cordon_rows(conn, row.node, row.uuid):
                    continue
                conn.execute(
                    insert(schema.cordons).values(
                        node=row.node, device_uuid=row.uuid, reason=reason, created_at=now
                    )
                )
                made.append((row.node, int(row.device_index)))
            return made

        return self._write(work)

    def release_devices(self, devices: Sequence[tuple[str, int]], reason: str) -> int:
        """Lift the cordons ``reserve_devices(devices, reason)`` made; others stay."""

        def work(conn: Connection) -> int:
            c = schema.cordons
            lifted = 0
            for node, index in devices:
                row = self._device_row(conn, node, index)
                result = conn.execute(
                    delete(c).where(
                        c.c.node == node, c.c.device_uuid == row.uuid, c.c.reason == reason
                    )
                )
                lifted += result.rowcount
            return lifted

        return self._write(work)

    def invalidate_vanished(self, reason: str) -> list[JobRecord]:
        """Requeue every active job whose resources name a device or partition the
        inventory no longer has (its runner, if one starts, finds the attempt gone)."""
        with self._read() as conn:
            known = set(conn.execute(select(schema.devices.c.uuid)).scalars())
            known |= set(conn.execute(select(schema.partitions.c.uuid)).scalars())
            stale = [
                j
                for j in self._job_records(conn)
                if j.state in ACTIVE_STATES and any(r not in known for r in j.resource_ids)
            ]
        out = []
        for job in stale:
            gone = [r for r in job.resource_ids if r not in known]
            try:
                out.append(
                    self.requeue_job(
                        job.job_id,
                        str(JobState.LOST),
                        expect_attempt=job.attempt,
                        resource_ids=[],
                        detail=f"{', '.join(gone)} no longer exist(s): {reason}",
                    )
                )
            except (JobConflictError, IllegalTransitionError):
                continue  # it moved on meanwhile (ended, or a new attempt): not ours to undo
        return out
