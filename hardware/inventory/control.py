"""The job control channel: "checkpoint now" / "checkpoint and stop" flags per job.

Remediation and preemption write a request; the training loop polls for the oldest
pending one every step (one indexed read), checkpoints, and acknowledges with the
checkpoint id; the requester waits for that acknowledgement. Any process that can reach
the inventory can take either side.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import schema
from gpuflow.hardware.inventory.base import (
    StoreBase,
    check_choice,
    check_name,
    check_seconds,
    in_chunks,
)
from gpuflow.hardware.inventory.records import CONTROL_ACTIONS, ControlRequest, ControlTimeoutError
from sqlalchemy import Connection, Row, insert, select, update


def _record(row: Row[Any]) -> ControlRequest:
    return ControlRequest(
        request_id=row.id,
        job_id=row.job_id,
        action=row.action,
        status=row.status,
        requested_at_s=row.requested_at,
        acked_at_s=row.acked_at,
        checkpoint_id=row.checkpoint_id,
    )


def _check_request_id(request_id: object) -> int:
    if isinstance(request_id, bool) or not isinstance(request_id, int) or request_id < 1:
        raise InvalidRequestError(
            f"control request id must be a positive integer, got {request_id!r}"
        )
    return request_id


class ControlMixin(StoreBase):
    def request_control(self, job_id: str, action: str) -> int:
        """Ask job ``job_id`` to ``checkpoint-now`` or ``checkpoint-and-stop``; returns the
        request id. Asking again while the same action is pending returns the pending id."""
        check_name(job_id, "job id")
        check_choice(action, CONTROL_ACTIONS, "control action")
        c = schema.control_requests

        def work(conn: Connection) -> int:
            pending = conn.execute(
                select(c.c.id)
                .where(c.c.job_id == job_id, c.c.action == action, c.c.status == "pending")
                .order_by(c.c.id)
            ).first()
            if pending is not None:
                return int(pending.id)
            result = conn.execute(
                insert(c).values(
                    job_id=job_id, action=action, status="pending", requested_at=self._clock()
                )
            )
            return int(result.inserted_primary_key[0])

        return self._write(work)

    def poll_control(self, job_id: str) -> ControlRequest | None:
        """The job's oldest pending request, or None. Cheap: meant for every training step."""
        check_name(job_id, "job id")
        c = schema.control_requests
        with self._read() as conn:
            row = conn.execute(
                select(c)
                .where(c.c.job_id == job_id, c.c.status == "pending")
                .order_by(c.c.id)
                .limit(1)
            ).first()
        return None if row is None else _record(row)

    def ack_control(self, request_id: int, checkpoint_id: str) -> ControlRequest:
        """Acknowledge a request with the checkpoint that answers it.

        The first acknowledgement wins; acknowledging again returns the request as it is.
        If the job is in the jobs registry its last checkpoint id is updated too.
        """
        _check_request_id(request_id)
        check_name(checkpoint_id, "checkpoint id")
        c, j = schema.control_requests, schema.jobs

        def work(conn: Connection) -> ControlRequest:
            row = self._request_row(conn, request_id)
            if row.status == "pending":
                now = self._clock()
                conn.execute(
                    update(c)
                    .where(c.c.id == request_id, c.c.status == "pending")
                    .values(status="acked", acked_at=now, checkpoint_id=checkpoint_id)
                )
                conn.execute(
                    update(j)
                    .where(j.c.job_id == row.job_id)
                    .values(last_checkpoint_id=checkpoint_id, updated_at=now)
                )
            return _record(self._request_row(conn, request_id))

        return self._write(work)

    def control_request(self, request_id: int) -> ControlRequest:
        _check_request_id(request_id)
        with self._read() as conn:
            return _record(self._request_row(conn, request_id))

    def control_requests_by_id(self, request_ids: Iterable[int]) -> dict[int, ControlRequest]:
        """The requests of ``request_ids`` that exist, by id, in one read (a scheduler pass
        looks at every stopping job's request)."""
        ids = sorted({_check_request_id(r) for r in request_ids})
        c = schema.control_requests
        out: dict[int, ControlRequest] = {}
        with self._read() as conn:
            for chunk in in_chunks(ids):
                for row in conn.execute(select(c).where(c.c.id.in_(chunk))):
                    out[int(row.id)] = _record(row)
        return out

    def control_requests(self, job_id: str) -> list[ControlRequest]:
        """Every request for a job, oldest first."""
        check_name(job_id, "job id")
        c = schema.control_requests
        with self._read() as conn:
            rows = conn.execute(select(c).where(c.c.job_id == job_id).order_by(c.c.id))
            return [_record(r) for r in rows]

    def wait_for_ack(
        self, request_id: int, timeout_s: float, poll_s: float = 0.2
    ) -> ControlRequest:
        """Block until the request is acknowledged and return it; ControlTimeoutError
        (a TimeoutError, carrying the request) after ``timeout_s`` of wall time."""
        _check_request_id(request_id)
        timeout = check_seconds(timeout_s, "timeout_s", allow_zero=True)
        poll = check_seconds(poll_s, "poll_s")
        deadline = time.monotonic() + timeout  # wall time, not the injectable clock
        while True:
            req = self.control_request(request_id)
            if req.status == "acked":
                return req
            left = deadline - time.monotonic()
            if left <= 0:
                raise ControlTimeoutError(req, timeout)
            time.sleep(min(poll, left))

    @staticmethod
    def _request_row(conn: Connection, request_id: int) -> Row[Any]:
        c = schema.control_requests
        row = conn.execute(select(c).where(c.c.id == request_id)).first()
        if row is None:
            raise InvalidRequestError(f"unknown control request id {request_id}")
        return row
