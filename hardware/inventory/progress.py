"""Job progress: how much work each job has done, so another process can time it.

The DVFS controller (tasks/energy/controller.py) runs outside the training process and
measures time and energy per unit of work: energy from the device's counter, units from
here. A job publishes its step count (tasks/energy/progress.py, a step hook); a reader
takes two readings and divides.

Rules:
- one row per job, the latest attempt's. Within one attempt ``units_done`` never goes
  back: of two reports that race (two ranks, a retried write) the larger stays, so a
  reader never sees negative progress. A newer attempt (the job resumed from a
  checkpoint, maybe at a lower step) replaces the row; a report of an older attempt (a
  zombie runner) changes nothing.
- ``updated_at`` is when ``units_done`` last grew, on the reporter's inventory clock: a
  report that adds nothing does not move it, so (units, updated_at) pairs time the work
  itself and a reader that polls late does not count its own lag as the job's.
- the attempt defaults to the job's attempt in the jobs registry (0 for a job not there):
  the runner of attempt n reports for n without having to say so.

The table lives here, on the inventory's metadata: create_all makes it on first use, in an
older database too, so no schema version step is needed (as gf_device_settings).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import schema
from gpuflow.hardware.inventory.base import StoreBase, check_index, check_name, check_seconds
from sqlalchemy import Column, Connection, Float, Integer, String, Table, insert, select, update

MAX_UNIT_LEN = 32

job_progress_table = Table(
    "gf_job_progress",
    schema.metadata,
    Column("job_id", String(255), primary_key=True),
    Column("attempt", Integer, nullable=False),
    Column("units_done", Float, nullable=False),
    Column("unit", String(MAX_UNIT_LEN), nullable=False),
    Column("updated_at", Float, nullable=False),
)


@dataclass(frozen=True)
class JobProgress:
    """A job's latest progress report: ``units_done`` units (``unit``: step, sample,
    epoch) by its attempt ``attempt``, reached at ``updated_at_s`` (inventory clock)."""

    job_id: str
    units_done: float
    unit: str
    updated_at_s: float
    attempt: int


def _check_units(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequestError(f"units_done must be a finite number, got {value!r}")
    if value < 0:
        raise InvalidRequestError(f"units_done must be >= 0, got {value}")
    return float(value)


def _record(row: object) -> JobProgress:
    return JobProgress(
        job_id=row.job_id,  # type: ignore[attr-defined]
        units_done=float(row.units_done),  # type: ignore[attr-defined]
        unit=row.unit,  # type: ignore[attr-defined]
        updated_at_s=float(row.updated_at),  # type: ignore[attr-defined]
        attempt=int(row.attempt),  # type: ignore[attr-defined]
    )


class ProgressMixin(StoreBase):
    def report_progress(
        self,
        job_id: str,
        units_done: float,
        *,
        unit: str = "step",
        attempt: int | None = None,
        now: float | None = None,
    ) -> JobProgress:
        """Record that ``job_id`` has done ``units_done`` units (module docstring: never
        back within an attempt; a newer attempt replaces; an older one is ignored) and
        return the row as stored. Raises InvalidRequestError for bad input, or a unit
        other than the one this attempt reported in before."""
        check_name(job_id, "job id")
        units = _check_units(units_done)
        check_name(unit, "progress unit")
        if len(unit) > MAX_UNIT_LEN:
            raise InvalidRequestError(f"progress unit is longer than {MAX_UNIT_LEN}: {unit!r}")
        if attempt is not None:
            check_index(attempt, "attempt")
        at = None if now is None else check_seconds(now, "now", allow_zero=True)
        p, j = job_progress_table, schema.jobs

        def work(conn: Connection) -> JobProgress:
            t = self._clock() if at is None else at
            mine = attempt
            if mine is None:
                registered = conn.execute(select(j.c.attempt).where(j.c.job_id == job_id))
                mine = int(registered.scalar_one_or_none() or 0)
            row = conn.execute(select(p).where(p.c.job_id == job_id)).first()
            values = {"attempt": mine, "units_done": units, "unit": unit, "updated_at": t}
            if row is None:
                # A racing first INSERT raises IntegrityError; run_write retries the whole.
                conn.execute(insert(p).values(job_id=job_id, **values))
            elif mine > row.attempt:
                conn.execute(update(p).where(p.c.job_id == job_id).values(**values))
            elif mine == row.attempt:
                if unit != row.unit:
                    raise InvalidRequestError(
                        f"job {job_id!r} attempt {mine} reports progress in {row.unit!r}s, "
                        f"not {unit!r}s"
                    )
                # Compare inside the UPDATE too: a concurrent larger report never loses.
                conn.execute(
                    update(p)
                    .where(p.c.job_id == job_id, p.c.attempt == mine, p.c.units_done < units)
                    .values(units_done=units, updated_at=t)
                )
            return _record(conn.execute(select(p).where(p.c.job_id == job_id)).one())

        return self._write(work)

    def job_progress(self, job_id: str) -> JobProgress | None:
        """The latest progress report of ``job_id``, or None when it never reported."""
        check_name(job_id, "job id")
        p = job_progress_table
        with self._read() as conn:
            row = conn.execute(select(p).where(p.c.job_id == job_id)).first()
        return None if row is None else _record(row)

    def clear_progress(self, job_id: str) -> bool:
        """Forget ``job_id``'s progress (the job is gone for good); False if none."""
        check_name(job_id, "job id")
        p = job_progress_table

        def work(conn: Connection) -> bool:
            return conn.execute(p.delete().where(p.c.job_id == job_id)).rowcount > 0

        return self._write(work)
