"""The job lifecycle: the one state machine every writer of a job's state goes through.

    queued -> placed -> launching -> running -> checkpointing -> stopped -> queued ...
                                            \\-> finished | failed | lost -> queued ...

A placement starts a new *attempt* (the counter on the job row); leases are owned by
(job, attempt), so whatever an older attempt still does is fenced. Every write is one
compare-and-swap statement, ``UPDATE gf_jobs ... WHERE job_id=? AND state=? AND
attempt=?``, on the (state, attempt) the writer read: of two writers racing on one job,
exactly one matches a row; the other gets JobConflictError and nothing is written. A move
the table below does not allow raises IllegalTransitionError naming the job, its state and
the move asked for. A move to the state a job is already in only updates its fields
(checkpoint id, resources, info); it is always allowed and still compares and swaps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuflow.hardware.inventory import schema
from gpuflow.hardware.inventory.base import check_choice, check_name
from gpuflow.hardware.inventory.jobs import JobsMixin, job_record, json_object, resource_id_list
from gpuflow.hardware.inventory.records import (
    JOB_STATES,
    IllegalTransitionError,
    JobConflictError,
    JobRecord,
    JobState,
)
from sqlalchemy import Connection, Row, delete, update

Q, P, LA, R, C, S, F, X, LO = (
    JobState.QUEUED,
    JobState.PLACED,
    JobState.LAUNCHING,
    JobState.RUNNING,
    JobState.CHECKPOINTING,
    JobState.STOPPED,
    JobState.FINISHED,
    JobState.FAILED,
    JobState.LOST,
)

# An attempt is live from its placement until it stops, ends or is lost.
ACTIVE_STATES: tuple[JobState, ...] = (P, LA, R, C)
# Waiting for a (new) placement: queued, or stopped/lost until a pass re-queues it.
WAITING_STATES: tuple[JobState, ...] = (Q, S, LO)
DONE_STATES: tuple[JobState, ...] = (F, X)

TRANSITIONS: dict[JobState, tuple[JobState, ...]] = {
    Q: (P, X),  # placed, or cancelled/quarantined
    P: (LA, R, S, F, X, LO, Q),  # Q: the placement was undone before anything started
    LA: (R, S, F, X, LO),
    R: (C, S, F, X, LO),
    C: (R, S, F, X, LO),  # R: a checkpoint-now done, the attempt trains on
    S: (Q, P, X),
    LO: (Q, P, X),
    F: (Q, P),  # submitted again under the same id
    X: (Q, P),
}
_COLUMN_FIELDS = ("last_checkpoint_id", "resource_ids")


def allowed(state: JobState, to: JobState) -> bool:
    return state == to or to in TRANSITIONS[state]


def is_active(state: str) -> bool:
    return state in ACTIVE_STATES


class LifecycleMixin(JobsMixin):
    def transition_job(
        self,
        job_id: str,
        to: str | None = None,
        *,
        expect_state: str | None = None,
        expect_attempt: int | None = None,
        **fields: Any,
    ) -> JobRecord:
        """Move ``job_id`` to ``to`` (None: keep its state, update fields only).

        ``expect_state``/``expect_attempt``: what the caller last saw; a job found in
        another state or attempt raises JobConflictError (a stale attempt is refused this
        way). ``last_checkpoint_id`` and ``resource_ids`` update those columns; any other
        keyword is merged into ``info`` (JSON values). A move to ``placed`` from another
        state starts the next attempt (use place_job to name it).
        """
        check_name(job_id, "job id")
        target = None if to is None else JobState(check_choice(to, JOB_STATES, "job state"))
        expected = None if expect_state is None else JobState(expect_state)
        values, extra = _values(fields)

        def work(conn: Connection) -> JobRecord:
            row = self._job_row(conn, job_id)
            _check_expected(row, expected, expect_attempt, target)
            return self._cas(conn, row, target, values, extra)

        return self._write(work)

    def place_job(
        self,
        job_id: str,
        resource_ids: Sequence[str],
        *,
        attempt: int,
        expect_state: str | None = None,
        supersede: bool = False,
        **fields: Any,
    ) -> JobRecord:
        """Place a waiting job as attempt ``attempt`` (its current attempt + 1, the one its
        leases were taken for) on ``resource_ids``.

        A job at another attempt raises JobConflictError (someone placed it first). A job
        whose earlier attempt is still active is refused (IllegalTransitionError) unless
        ``supersede``: the caller holds the leases the old attempt ran on, so it is gone;
        it is marked lost, the leases it still has are ended (its runner's next renewal
        fails) and it is placed anew, in one transaction.
        """
        check_name(job_id, "job id")
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise JobConflictError(job_id, "an attempt >= 1", f"attempt {attempt!r}", P)
        expected = None if expect_state is None else JobState(expect_state)
        values, extra = _values({**fields, "resource_ids": resource_ids})

        def work(conn: Connection) -> JobRecord:
            row = self._job_row(conn, job_id)
            _check_expected(row, expected, attempt - 1, P)
            state = JobState(row.state)
            if state in ACTIVE_STATES:
                if not supersede:
                    raise IllegalTransitionError(
                        job_id, state, P, tuple(str(s) for s in TRANSITIONS[state])
                    )
                self._cas(conn, row, LO, {}, {"superseded_at_s": self._clock()})
                # Its leases go with it: they would keep devices from everyone, and its
                # runner's renewals alive, until someone else noticed.
                leases = schema.leases
                conn.execute(
                    delete(leases).where(leases.c.owner == job_id, leases.c.attempt == row.attempt)
                )
                row = self._job_row(conn, job_id)
            return self._cas(conn, row, P, values, extra)

        return self._write(work)

    def place_jobs(self, placements: Sequence[JobPlacement]) -> list[JobRecord]:
        """place_job (without supersede) for several jobs in ONE transaction, all or none:
        the first compare-and-swap that fails raises (JobConflictError, naming the job)
        and nothing is written. A scheduler pass records all its placements at once."""
        checked = []
        for job_id, resource_ids, attempt, expect_state, fields in placements:
            check_name(job_id, "job id")
            if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
                raise JobConflictError(job_id, "an attempt >= 1", f"attempt {attempt!r}", P)
            expected = None if expect_state is None else JobState(expect_state)
            checked.append(
                (job_id, attempt, expected, _values({**fields, "resource_ids": resource_ids}))
            )

        def work(conn: Connection) -> list[JobRecord]:
            out = []
            for job_id, attempt, expected, (values, extra) in checked:
                row = self._job_row(conn, job_id)
                _check_expected(row, expected, attempt - 1, P)
                out.append(self._cas(conn, row, P, values, extra))
            return out

        return self._write(work)

    def mark_launching(self, job_id: str, attempt: int) -> bool:
        """placed -> launching for ``attempt`` (a launcher starting its runner); False when
        the attempt is already past placed (a retried launch). A stale attempt raises
        JobConflictError."""
        current = self.job(job_id)
        _check_expected_row(current.job_id, current.state, current.attempt, attempt)
        if current.state != P:
            return False
        self.transition_job(job_id, LA, expect_state=P, expect_attempt=attempt)
        return True

    def requeue_job(
        self, job_id: str, via: str, *, expect_attempt: int | None = None, **fields: Any
    ) -> JobRecord:
        """Queue a job again for a new placement. An active attempt first goes to ``via``
        ("stopped": it stopped with a checkpoint; "lost": its runner is gone), then to
        queued, two compare-and-swaps in one transaction; a stopped or lost job goes
        straight to queued; a queued one only has its fields updated."""
        check_name(job_id, "job id")
        cause = JobState(check_choice(via, (S, LO), "requeue cause"))
        values, extra = _values(fields)

        def work(conn: Connection) -> JobRecord:
            row = self._job_row(conn, job_id)
            _check_expected(row, None, expect_attempt, Q)
            if JobState(row.state) in ACTIVE_STATES:
                self._cas(conn, row, cause, {}, {})
                row = self._job_row(conn, job_id)
            return self._cas(conn, row, Q, values, extra)

        return self._write(work)

    def _cas(
        self,
        conn: Connection,
        row: Row[Any],
        to: JobState | None,
        values: dict[str, Any],
        extra: dict[str, Any],
    ) -> JobRecord:
        state = JobState(row.state)
        target = state if to is None else to
        if not allowed(state, target):
            raise IllegalTransitionError(
                row.job_id, state, target, tuple(str(s) for s in TRANSITIONS[state])
            )
        attempt = row.attempt + 1 if target == P and state != P else row.attempt
        j = schema.jobs
        result = conn.execute(
            update(j)
            .where(j.c.job_id == row.job_id, j.c.state == row.state, j.c.attempt == row.attempt)
            .values(
                state=str(target),
                attempt=attempt,
                info={**dict(row.info), **extra},
                updated_at=self._clock(),
                **values,
            )
        )
        if result.rowcount != 1:
            found = self._job_row(conn, row.job_id)
            raise JobConflictError(
                row.job_id,
                f"{row.state} at attempt {row.attempt}",
                f"{found.state} at attempt {found.attempt}",
                str(target),
            )
        return job_record(self._job_row(conn, row.job_id))


# (job id, resource ids, attempt, expected state or None, fields): one place_job
JobPlacement = tuple[str, Sequence[str], int, str | None, dict[str, Any]]


def _values(fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(column values, info fields) from a transition's keywords, checked."""
    values: dict[str, Any] = {}
    if "last_checkpoint_id" in fields:
        ckpt = fields["last_checkpoint_id"]
        values["last_checkpoint_id"] = None if ckpt is None else check_name(ckpt, "checkpoint id")
    if "resource_ids" in fields:
        values["resource_ids"] = resource_id_list(fields["resource_ids"])
    extra = json_object({k: v for k, v in fields.items() if k not in _COLUMN_FIELDS}, "job fields")
    return values, extra


def _check_expected_row(
    job_id: str, state: str, found: int, attempt: int, to: JobState | None = None
) -> None:
    if found != attempt:
        raise JobConflictError(
            job_id,
            f"attempt {attempt}",
            f"attempt {found} ({state}): attempt {attempt} is stale",
            None if to is None else str(to),
        )


def _check_expected(
    row: Row[Any], state: JobState | None, attempt: int | None, to: JobState | None
) -> None:
    if state is not None and row.state != state:
        raise JobConflictError(
            row.job_id, f"state {state}", f"state {row.state}", None if to is None else str(to)
        )
    if attempt is not None:
        _check_expected_row(row.job_id, row.state, row.attempt, attempt, to)
