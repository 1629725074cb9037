"""A minimal jobs registry: what each job asked for, its state, what it holds, and its
last checkpoint, so remediation and scheduling can find and restart it. Every change of
a recorded job goes through lifecycle.py (the state machine)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import schema
from gpuflow.hardware.inventory.base import StoreBase, check_choice, check_name
from gpuflow.hardware.inventory.records import JOB_STATES, JobRecord, JobState
from sqlalchemy import Connection, Row, insert, select, update


def job_record(row: Row[Any]) -> JobRecord:
    return JobRecord(
        job_id=row.job_id,
        spec=dict(row.spec),
        state=JobState(row.state),
        resource_ids=tuple(row.resource_ids),
        last_checkpoint_id=row.last_checkpoint_id,
        info=dict(row.info),
        created_at_s=row.created_at,
        updated_at_s=row.updated_at,
        attempt=int(row.attempt),
    )


def json_object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise InvalidRequestError(f"{what} must be a dict with string keys, got {value!r}")
    try:
        # Round-trip: what we return is what a fresh read returns (tuples become lists).
        out: dict[str, Any] = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"{what} is not JSON-serialisable: {exc}") from exc
    return out


def resource_id_list(value: object) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise InvalidRequestError(f"resource_ids must be a list of ids, got {value!r}")
    return [check_name(v, "resource id") for v in value]


class JobsMixin(StoreBase):
    def record_job(
        self,
        job_id: str,
        spec: dict[str, Any],
        state: str = JobState.QUEUED,
        resource_ids: Sequence[str] = (),
    ) -> JobRecord:
        """Register a job at attempt 0 (queued unless ``state`` says otherwise). Recording
        the same id with the same spec again returns the existing record (safe under task
        retries); with another spec it is refused while the job lives. A finished or
        failed job recorded with another spec (its owner resumes it with other settings:
        fewer GPUs, more steps) takes the new spec and ``state``; its attempts count on,
        so fencing tokens and attempt checks stay monotonic."""
        check_name(job_id, "job id")
        clean = json_object(spec, "job spec")
        check_choice(state, JOB_STATES, "job state")
        ids = resource_id_list(resource_ids)
        j = schema.jobs

        def work(conn: Connection) -> JobRecord:
            row = conn.execute(select(j).where(j.c.job_id == job_id)).first()
            if row is not None:
                if row.spec == clean:
                    return job_record(row)
                if row.state not in (JobState.FINISHED, JobState.FAILED):
                    raise InvalidRequestError(
                        f"job {job_id!r} is already recorded with another spec "
                        f"(it is {row.state}: cancel it or wait for it to end)"
                    )
                conn.execute(
                    update(j)
                    .where(j.c.job_id == job_id, j.c.attempt == row.attempt)
                    .values(
                        spec=clean,
                        state=str(JobState(state)),
                        resource_ids=ids,
                        updated_at=self._clock(),
                    )
                )
                return job_record(conn.execute(select(j).where(j.c.job_id == job_id)).one())
            now = self._clock()
            conn.execute(
                insert(j).values(
                    job_id=job_id,
                    spec=clean,
                    state=str(JobState(state)),
                    resource_ids=ids,
                    last_checkpoint_id=None,
                    info={},
                    created_at=now,
                    updated_at=now,
                    attempt=0,
                )
            )
            return job_record(conn.execute(select(j).where(j.c.job_id == job_id)).one())

        return self._write(work)

    def job(self, job_id: str) -> JobRecord:
        check_name(job_id, "job id")
        with self._read() as conn:
            return job_record(self._job_row(conn, job_id))

    def jobs(self, state: str | None = None) -> list[JobRecord]:
        """Jobs, oldest first, optionally only those in ``state``."""
        if state is not None:
            check_choice(state, JOB_STATES, "job state")
        with self._read() as conn:
            return self._job_records(conn, state)

    @staticmethod
    def _job_records(conn: Connection, state: str | None = None) -> list[JobRecord]:
        j = schema.jobs
        query = select(j).order_by(j.c.created_at, j.c.job_id)
        if state is not None:
            query = query.where(j.c.state == state)
        return [job_record(r) for r in conn.execute(query)]

    @staticmethod
    def _job_row(conn: Connection, job_id: str) -> Row[Any]:
        j = schema.jobs
        row = conn.execute(select(j).where(j.c.job_id == job_id)).first()
        if row is None:
            raise InvalidRequestError(f"unknown job {job_id!r}")
        return row
