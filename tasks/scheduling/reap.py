"""The reap: what happened since the last pass, applied before it decides. Jobs that
stopped, ended or vanished; victims that acknowledged, or never did within the grace
(force-stopped: leases revoked, re-queued as lost); leases of attempts that are over;
stored requests that no longer validate (quarantined, named, and the pass goes on)."""

from __future__ import annotations

import logging
import time
from typing import Any

from gpuflow.hardware.inventory import (
    ACTIVE_STATES,
    ControlRequest,
    JobRecord,
    JobState,
    JobTransitionError,
)
from gpuflow.tasks.scheduling.engine import Engine
from gpuflow.tasks.scheduling.model import (
    CANCELLED,
    FAILED,
    FINISHED,
    QUEUED,
    RUNNING,
    STOPPING,
)
from gpuflow.tasks.scheduling.refresh import RefreshMixin
from gpuflow.tasks.scheduling.service_state import (
    ACK_GRACE_S,
    QUARANTINED,
    STOPPED_STATES,
    PassReport,
)

log = logging.getLogger(__name__)


class ReapMixin(RefreshMixin):
    """The reap and the waits for stopping victims (part of SchedulerService)."""

    def _pending_stops(self, engine: Engine) -> list[str]:
        return [j.job_id for j in engine.live_jobs() if j.state == STOPPING]

    def _stop_done(self, job_id: str) -> bool:
        """Whether a stopping job has stopped: the loop acknowledged and then recorded
        "stopped" (its last write), or acknowledged longer than ACK_GRACE_S ago."""
        record = self.inventory.job(job_id)
        if record.state in STOPPED_STATES:
            return True
        request_id = self._sched(record).get("stop_request_id")
        if not request_id:
            return False
        req = self.inventory.control_request(int(request_id))
        return req.status == "acked" and self._now() - (req.acked_at_s or 0.0) > ACK_GRACE_S

    def _wait_any(self, job_ids: list[str], deadline: float) -> bool:
        """Wait until one of the stopping jobs has stopped; False at the deadline."""
        while time.monotonic() < deadline:
            if any(self._stop_done(j) for j in job_ids):
                return True
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        return False

    def _reap(self, engine: Engine, report: PassReport) -> None:
        """Apply what happened since the last pass: jobs that stopped, ended or vanished,
        victims that never acknowledged, leases of attempts that are over, requests that
        no longer validate. One job's conflict is reported; the others go on."""
        now = self._now()
        for lease in self._stale:
            # An older attempt's lease: fence it (its keeper finds it gone and stops).
            self.inventory.release_lease(lease.resource_id, lease.owner, attempt=lease.attempt)
        self._stale = []
        for job_id, error in sorted(self._invalid.items()):
            self._quarantine(job_id, error, report)
        candidates = self._reap_candidates(engine)
        stops = [
            int(s["stop_request_id"])
            for s in map(self._sched, candidates.values())
            if s.get("stop_request_id")
        ]
        self._controls = self.inventory.control_requests_by_id(stops) if stops else {}
        for job_id, record in candidates.items():
            if job_id in self._invalid:
                continue
            try:
                self._reap_one(engine, job_id, record, report, now)
            except JobTransitionError as exc:
                report.errors.append(f"{job_id}: {exc}")
        self._controls = {}

    def _reap_candidates(self, engine: Engine) -> dict[str, JobRecord]:
        """The records the reap must look at: all after a rebuild; after changes applied,
        the jobs they touched and the stopping ones (whose graces run out with time). No
        other job's rows or leases changed, so nothing else has anything to reap."""
        if self._reap_all:
            self._reap_all = False
            return dict(self._records)
        ids = set(self._to_reap)
        ids |= {j.job_id for j in engine.jobs.values() if j.state == STOPPING}
        self._to_reap = set()
        return {j: self._records[j] for j in sorted(ids) if j in self._records}

    def _control(self, request_id: int) -> ControlRequest:
        """A stop request, as the reap read it at its start (or now, if it did not)."""
        found = self._controls.get(request_id)
        return found if found is not None else self.inventory.control_request(request_id)

    def _quarantine(self, job_id: str, error: str, report: PassReport) -> None:
        """A stored request that no longer validates: the job fails as "quarantined",
        named in the report, and gives back what it holds; the pass goes on."""
        if self._owned.get(job_id):
            self._unlease_all(set(self._owned[job_id]), job_id)
        try:
            self._write(job_id, JobState.FAILED, resource_ids=[], phase=QUARANTINED, reason=error)
        except JobTransitionError as exc:
            report.errors.append(f"{job_id}: could not quarantine: {exc}")
            return
        report.quarantined.append({"job_id": job_id, "error": error})
        log.error("job %s quarantined: its stored request no longer validates: %s", job_id, error)

    def _reap_one(
        self, engine: Engine, job_id: str, record: JobRecord, report: PassReport, now: float
    ) -> None:
        s = self._sched(record)
        job = engine.jobs.get(job_id)
        owned = self._owned.get(job_id, set())
        if record.state in (JobState.FINISHED, JobState.FAILED):
            if owned:
                self._unlease_all(set(owned), job_id)
            if s.get("phase") not in (FINISHED, FAILED, CANCELLED, QUARANTINED):
                phase = FINISHED if record.state == JobState.FINISHED else FAILED
                self._write(job_id, None, phase=phase)
                report.finished.append(job_id)
            return
        if job is None:
            return
        acked = None
        if s.get("stop_request_id"):
            req = self._control(int(s["stop_request_id"]))
            acked = req if req.status == "acked" else None
        # After the ack the loop still writes "stopped": wait for that write (or a grace
        # period), or it could land after a re-placement and undo it.
        waiting = record.state in STOPPED_STATES
        asked_at = s.get("stop_requested_at_s")
        forced = (
            job.state == STOPPING
            and not waiting
            and acked is None
            and asked_at is not None
            and now - float(asked_at) > self.stop_grace_s
        )
        stopped = (
            waiting
            or forced
            or (
                job.state == STOPPING
                and acked is not None
                and now - (acked.acked_at_s or 0.0) > ACK_GRACE_S
            )
        )
        if waiting and job.state == QUEUED:
            # Stopped and already gave its leases back: only the bookkeeping is left.
            ckpt = (acked.checkpoint_id if acked else None) or record.last_checkpoint_id
            if s.get("cancel_requested"):
                engine.cancel(job_id, now)
                self._write_cancelled(job_id)
                return
            self._write_requeued(
                job_id,
                JobState.STOPPED,
                ckpt,
                preemptions=int(s.get("preemptions", 0)) + (1 if s.get("stop_for") else 0),
            )
            job.preemptions = int(s.get("preemptions", 0)) + (1 if s.get("stop_for") else 0)
            report.requeued.append(job_id)
            return
        if stopped and job.state in (RUNNING, STOPPING):
            if forced:
                # It never answered: revoke its leases (its keeper stops it), answer the
                # request ourselves and re-queue it from its last checkpoint, as lost.
                if owned:
                    self._unlease_all(set(owned), job_id)
                self._answer_stale_stop(s, record)
                report.forced.append(job_id)
            ckpt = (acked.checkpoint_id if acked else None) or record.last_checkpoint_id
            if s.get("cancel_requested"):
                job.stop_action = "cancel"
            beneficiary = job.stop_for
            engine.stopped(job_id, now, ckpt)
            self._sync_leases(job, report)
            if beneficiary and beneficiary in engine.jobs:
                self._sync_leases(engine.jobs[beneficiary], report)
            if job.state == CANCELLED:
                self._write_cancelled(job_id)
                return
            self._write_requeued(
                job_id,
                JobState.LOST if forced else JobState.STOPPED,
                ckpt,
                preemptions=job.preemptions,
            )
            report.requeued.append(job_id)
            return
        if job.state in (RUNNING, STOPPING) and record.state in ACTIVE_STATES:
            placed = set(record.resource_ids)
            if not placed or not placed <= owned:
                # The runner keeps every unit of its attempt leased (binding.py's
                # attempt_resources): one lapsed, it is gone or broken. Resume from the
                # last checkpoint.
                beneficiary = job.stop_for
                engine.fail(job_id, now, requeue=True)
                self._sync_leases(job, report)
                if beneficiary and beneficiary in engine.jobs:
                    self._sync_leases(engine.jobs[beneficiary], report)
                self._requeue_lost(engine, job_id, s, record, now, report)
        elif job.state == QUEUED and record.state in ACTIVE_STATES:
            # Restored without any of its resources (its leases lapsed, or the devices
            # vanished): its runner is gone; it waits again, from its last checkpoint.
            self._requeue_lost(engine, job_id, s, record, now, report)

    def _requeue_lost(
        self,
        engine: Engine,
        job_id: str,
        sched: dict[str, Any],
        record: JobRecord,
        now: float,
        report: PassReport,
    ) -> None:
        """A job whose runner is gone: cancelled if that was asked, else queued again to
        resume from its last checkpoint."""
        self._answer_stale_stop(sched, record)
        if sched.get("cancel_requested"):
            engine.cancel(job_id, now)
            self._write_cancelled(job_id)
            return
        self._write_requeued(job_id, JobState.LOST, record.last_checkpoint_id, lost_at_s=now)
        report.lost.append(job_id)

    def _write_cancelled(self, job_id: str) -> None:
        self._write(
            job_id,
            JobState.FAILED,
            resource_ids=[],
            phase=CANCELLED,
            reason="cancelled",
            stop_request_id=None,
        )

    def _write_requeued(
        self, job_id: str, via: JobState, checkpoint_id: str | None, **sched: Any
    ) -> None:
        """Back to the queue (``via`` stopped or lost), to resume from ``checkpoint_id``,
        with every trace of the stop that ended the attempt cleared."""
        self._write(
            job_id,
            JobState.QUEUED,
            resource_ids=[],
            via=via,
            phase=QUEUED,
            resume_checkpoint=checkpoint_id,
            stop_request_id=None,
            stop_for=None,
            stop_action=None,
            stop_requested_at_s=None,
            release=[],
            **sched,
        )

    def _answer_stale_stop(self, sched: dict[str, Any], record: JobRecord) -> None:
        """Answer a stop request the job never will, or its relaunch would find it pending
        and stop at its first step. The first answer wins, so a late real one is kept."""
        if sched.get("stop_request_id"):
            self.inventory.ack_control(
                int(sched["stop_request_id"]), record.last_checkpoint_id or "no-checkpoint"
            )
