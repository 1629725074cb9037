"""The actors of the lifecycle machine (test_lifecycle_machine.py, whose docstring says
what they do and what must hold) and the model of what they did: schedulers, runners and a
remediator on one database, each with its own Inventory, the test's clock, a real
checkpoint store. Every action checks its own outcome (a write is refused exactly when it
is stale); ``observe`` checks the invariants; ``drain`` brings what is left to its end."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.hardware.backend import Backend
from gpuflow.hardware.inventory import (
    ACTIVE_STATES,
    WAITING_STATES,
    Inventory,
    JobRecord,
    JobState,
    JobTransitionError,
    Lease,
    LeaseLostError,
    schema,
)
from gpuflow.hardware.inventory.keeper import LeaseKeeper
from gpuflow.hardware.inventory.lifecycle import C, F, P, Q, R, S, X, allowed
from gpuflow.tasks.remediation import launch as remediation_launch
from gpuflow.tasks.remediation.devices import JobOnDevice, jobs_on_device
from gpuflow.tasks.remediation.launch import InProcessRunner, JobHandle, remember_launch
from gpuflow.tasks.remediation.steps import (
    CheckpointOutcome,
    RemediationPolicy,
    checkpoint_job,
    isolate,
    migrate_job,
    release_reservation,
    reserve_target,
)
from gpuflow.tasks.scheduling.model import JobRequest, SchedulerConfig
from gpuflow.tasks.scheduling.service import SchedulerService
from gpuflow.tasks.scheduling.train_placement import release_placement
from gpuflow.tasks.training.binding import (
    Binding,
    DeviceRequest,
    attempt_resources,
    torch_device_for,
)
from gpuflow.tasks.training.checkpoint import CheckpointManager, StaleTokenError
from gpuflow.tasks.training.job import FencedControl
from gpuflow.tasks.training.loop import CHECKPOINT_AND_STOP
from gpuflow.tasks.training.spec import TrainSpec
from gpuflow.tasks.training.storage import open_store
from sqlalchemy import create_engine, text

from tests.helpers.clock import ManualClock
from tests.helpers.cluster import Cluster
from tests.helpers.engine_state import engine_state

FLEET_YAML = """
name: lifecycle-machine
seed: 7
faults: {natural: false}
nodes:
  - name: n0
    region: r1
    role: active
    devices: [{sku: a100-40gb, count: 2}]
  - name: n1
    region: r1
    role: active
    devices: [{sku: a100-40gb, count: 2}]
"""
SKU = "a100-40gb"
TTL_S = 60.0  # the scheduler's and the runners' lease TTL
STOP_GRACE_S = 90.0  # a victim silent this long is force-stopped
RESERVATION_TTL_S = 600.0  # steps.reserve_target's default
# Time passing without renewals: within a TTL, past it, past remediation's reservations.
ADVANCES = (TTL_S / 3, TTL_S + 1, RESERVATION_TTL_S + 1)
N_SCHEDULERS, N_RUNNERS, MAX_JOBS = 2, 3, 5
DRAIN_ROUNDS = 2 * MAX_JOBS + 2
# The device is gone: checkpoint_job asks nothing and takes the last periodic checkpoint.
LOST_DEVICE = RemediationPolicy(lost_device_grace_s=0.0)


@dataclass
class Attempt:
    """What a runner knows of the attempt it runs: its binding (job, attempt, primary
    lease and fencing token, as launched), its keeper and its checkpoint manager."""

    binding: Binding
    keeper: LeaseKeeper
    checkpoints: CheckpointManager
    step: int
    running: bool = False
    last_checkpoint: str | None = None

    @property
    def job_id(self) -> str:
        return self.binding.lease.owner

    @property
    def attempt(self) -> int:
        return self.binding.lease.attempt

    @property
    def primary(self) -> str:
        return self.binding.resource.resource_id

    @property
    def token(self) -> int:
        return self.binding.lease.token


@dataclass
class Runner:
    """One runner process: its own inventory, and the attempt it runs (None: free)."""

    cluster: Cluster
    run: Attempt | None = None

    @property
    def inventory(self) -> Inventory:
        return self.cluster.inventory


@dataclass
class World:
    """Per store: the twin, and a fresh database and folder for every example (under
    ``tmp``)."""

    base_url: str
    tmp: Path
    backend: Backend
    monkeypatch: pytest.MonkeyPatch
    examples: int = 0

    def fresh(self) -> tuple[str, Path]:
        self.examples += 1
        folder = self.tmp / f"example-{self.examples}"
        folder.mkdir()
        if self.base_url.startswith("sqlite"):
            return f"sqlite:///{folder / 'inv.db'}", folder
        if self.examples > 1:
            # The inventory_url fixture wiped the database for the first example; the
            # later ones empty the inventory's tables (a TRUNCATE keeps the schema, much
            # cheaper than dropping and creating it again).
            names = ", ".join(t.name for t in schema.metadata.sorted_tables)
            engine = create_engine(self.base_url)
            try:
                with engine.begin() as conn:
                    conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
            finally:
                engine.dispose()
        return self.base_url, folder


@contextmanager
def scratch(fallback: Path) -> Iterator[Path]:
    """A folder in RAM (/dev/shm) where there is one, else under ``fallback``: SQLite's
    and the checkpoint store's fsyncs on a disk would cost most of this test's time, and
    RAM keeps their semantics (WAL, locks, atomic renames) without it."""
    ram = Path("/dev/shm")
    where = ram if ram.is_dir() and os.access(ram, os.W_OK) else fallback
    with tempfile.TemporaryDirectory(prefix="gpuflow-lifecycle-", dir=where) as folder:
        yield Path(folder)


class Relauncher(InProcessRunner):
    """The real InProcessRunner.resume (place_job with supersede, mark_launching); only
    its thread is a free runner of the actors instead."""

    def __init__(self, actors: Actors) -> None:
        super().__init__()
        self.actors = actors

    def _spawn(self, handle: JobHandle, binding: Binding, cluster: Any) -> None:
        runner = self.actors.runners[self.actors.free_runners()[0]]
        runner.run = self.actors.attempt_for(runner, binding)


class Actors:
    """Everyone on one fresh database, and what the test knows they did."""

    def __init__(self, world: World) -> None:
        url, folder = world.fresh()
        self.clock = ManualClock(1_000_000.0)
        self.backend = world.backend
        self.observer = Inventory(url, now=self.clock)
        self.observer.sync(self.backend)
        config = SchedulerConfig(lease_ttl_s=TTL_S)
        self.schedulers = [
            SchedulerService(
                Inventory(url, now=self.clock),
                self.backend,
                config,
                now=self.clock,
                stop_grace_s=STOP_GRACE_S,
                lock_wait_s=0.0,
            )
            for _ in range(N_SCHEDULERS)
        ]
        self.runners = [
            Runner(Cluster(Inventory(url, now=self.clock), self.backend)) for _ in range(N_RUNNERS)
        ]
        self.remediator = Cluster(Inventory(url, now=self.clock), self.backend)
        world.monkeypatch.setattr(remediation_launch, "RUNNER", Relauncher(self))
        self.storage = CheckpointStorage(kind="local", path=str(folder / "checkpoints"))
        self.store = open_store(self.storage)
        self.count: dict[str, int] = {}  # submitted job -> units
        self.cancel_asked: set[str] = set()
        self.finished: set[str] = set()  # finished by their runner
        self.ended: dict[str, JobState] = {}  # jobs seen done, and how
        self.newest_token: dict[str, int] = {}  # the store's newest committed token per job
        self.newest_step: dict[str, int] = {}
        # Remediation's jobs between its reserve and migrate steps: what migrate_job gets.
        self.pending: dict[str, tuple[JobOnDevice, CheckpointOutcome, Binding | None]] = {}
        self.cordoned: set[tuple[str, int]] = set()
        self.incidents = 0
        self.snap: dict[str, JobRecord] = {}
        self.observe()

    # ------------------------------------------------------------------ views
    def free_runners(self) -> list[int]:
        return [i for i, r in enumerate(self.runners) if r.run is None]

    def busy_runners(self, running: bool | None = None) -> list[int]:
        return [
            i
            for i, r in enumerate(self.runners)
            if r.run is not None and (running is None or r.run.running == running)
        ]

    def jobs_in(self, *states: JobState) -> list[str]:
        return sorted(j for j, r in self.snap.items() if r.state in states)

    def remediable(self) -> list[str]:
        return [
            j for j in self.jobs_in(*ACTIVE_STATES) if self.count[j] == 1 and j not in self.pending
        ]

    def attempt_for(self, runner: Runner, binding: Binding) -> Attempt:
        """A runner starts an attempt: resumes from the newest checkpoint, keeps its lease."""
        job_id, attempt = binding.lease.owner, binding.lease.attempt
        keeper = LeaseKeeper(
            runner.inventory,
            job_id,
            attempt,
            attempt_resources(runner.inventory, job_id, attempt, binding.resource.resource_id),
            TTL_S,
            clock=self.clock,
        )
        manager = CheckpointManager(
            self.store, job_id, keep_last=2, fencing_token=binding.lease.token
        )
        return Attempt(binding, keeper, manager, step=self.newest_step.get(job_id, 0))

    # ------------------------------------------------------------------ what a runner does
    def launch_job(self, runner: Runner, job_id: str) -> None:
        """launch_placed: mark_launching (only a placed attempt starts: a duplicate or late
        launch starts nothing); then placement_for_train's binding on the primary lease and
        the launch record remediation relaunches from (remember_launch)."""
        inv = runner.inventory
        record = inv.job(job_id)
        first = inv.mark_launching(job_id, record.attempt)
        assert first == (record.state == P), (job_id, record.state)
        if not first:
            return
        lease = inv.lease(record.resource_ids[0])
        if lease is None or lease.owner != job_id or lease.attempt != record.attempt:
            return  # "lost its lease right after placement": never starts; a pass reaps it
        resource = inv.resource(lease.resource_id)
        binding = Binding(resource, lease, None, torch_device_for(self.backend), self.backend.name)
        spec = TrainSpec(job_id=job_id)
        remember_launch(inv, spec, self.storage, DeviceRequest(), launcher="in-process")
        runner.run = self.attempt_for(runner, binding)

    def renew(self, runner: Runner) -> bool:
        """The keeper's renewal: it succeeds exactly while the primary lease is this
        attempt's; a fenced runner gets LeaseLostError and writes nothing more."""
        run = runner.run
        assert run is not None
        lease = self.observer.lease(run.primary)
        held = lease is not None and (lease.owner, lease.attempt) == (run.job_id, run.attempt)
        renewed = run.keeper.renew_now()
        assert renewed == held, (run.job_id, run.attempt, lease)
        if not renewed:
            with pytest.raises(LeaseLostError):
                run.keeper.check()
            runner.run = None  # run_scheduled_job re-raises: no release, no job-state write
        return renewed

    def write_expected(self, run: Attempt, to: JobState | None) -> bool:
        """Whether the registry takes this attempt's write (to None: fields only)."""
        record = self.observer.job(run.job_id)
        return record.attempt == run.attempt and (to is None or allowed(record.state, to))

    def transition(self, runner: Runner, to: JobState | None, **fields: Any) -> bool:
        run = runner.run
        assert run is not None
        expected = self.write_expected(run, to)
        try:
            runner.inventory.transition_job(run.job_id, to, expect_attempt=run.attempt, **fields)
        except JobTransitionError as exc:
            assert not expected, exc
            self.abandon(runner)
            return False
        assert expected, (run.job_id, run.attempt, to)
        return True

    def abandon(self, runner: Runner) -> None:
        """run_scheduled_job on any error but a lost lease: release_placement(ok=False),
        which a stale attempt's JobConflictError ends; the process then exits."""
        run = runner.run
        assert run is not None
        runner.run = None
        try:
            release_placement(runner.cluster, run.binding, run.job_id, ok=False)
        except JobTransitionError:
            pass

    def start_run(self, runner: Runner) -> None:
        """run_training: keeper.start() (an attempt whose lease is gone never starts), then
        "running" (compare-and-swap on the attempt)."""
        if self.renew(runner) and self.transition(runner, R):
            assert runner.run is not None
            runner.run.running = True

    def save(self, runner: Runner) -> str | None:
        """A checkpoint with the attempt's token (the store refuses one older than its
        newest), then its id in the registry (refused for a stale attempt)."""
        run = runner.run
        assert run is not None
        run.step += 1
        newest = self.newest_token.get(run.job_id, 0)
        try:
            cid = run.checkpoints.save({"step": torch.tensor(run.step)}, run.step)
        except StaleTokenError:
            assert newest > run.token, (run.job_id, newest, run.token)
            self.abandon(runner)
            return None
        assert newest <= run.token, (run.job_id, newest, run.token)
        self.newest_token[run.job_id] = run.token
        self.newest_step[run.job_id] = max(self.newest_step.get(run.job_id, 0), run.step)
        run.last_checkpoint = cid
        return cid if self.transition(runner, None, last_checkpoint_id=cid) else None

    def train_step(self, runner: Runner) -> None:
        """One step of train_loop: the control channel (FencedControl moves a
        checkpoint-and-stop to "checkpointing"), a checkpoint, the answer, the stop."""
        run = runner.run
        assert run is not None
        control = FencedControl(runner.inventory, run.job_id, run.attempt, run.keeper)
        expected = self.write_expected(run, C)
        try:
            request = control.poll_control(run.job_id)
        except JobTransitionError:
            assert not expected
            self.abandon(runner)
            return
        cid = self.save(runner)
        if cid is None or request is None:
            return
        control.ack_control(request.request_id, cid)
        if request.action == CHECKPOINT_AND_STOP:
            self.end_run(runner, stopped=True)

    def end_run(self, runner: Runner, stopped: bool) -> None:
        """run_training's last write (stopped or finished), then release_placement."""
        run = runner.run
        assert run is not None
        if not self.transition(runner, S if stopped else F, last_checkpoint_id=run.last_checkpoint):
            return
        runner.run = None
        release_placement(runner.cluster, run.binding, run.job_id, stopped_by_request=stopped)
        if not stopped:
            self.finished.add(run.job_id)

    # ------------------------------------------------------------------ the others
    def put_to_work(self, counts: list[int]) -> None:
        """Jobs of these sizes submitted and placed by a pass; the placed ones launched
        and started, one per runner."""
        for count in counts:
            self.submit_job(0, count, 0)
        self.schedulers[0].schedule_once()
        self.observe()
        for runner, job_id in zip(self.runners, self.jobs_in(P), strict=False):
            self.launch_job(runner, job_id)
            self.start_run(runner)

    def submit_job(self, via: int, count: int, priority: int) -> None:
        job_id = f"j{len(self.count) + 1}"
        request = JobRequest(job_id=job_id, count=count, skus=(SKU,), priority=priority)
        record = self.schedulers[via].submit(request)
        assert (record.state, record.attempt) == (Q, 0)
        self.count[job_id] = count

    def remediate_job(self, job_id: str) -> None:
        """A device is lost under a running job: isolate it, requeue the job lost with a
        marker (fencing its lease), reserve a target for the next attempt."""
        inv = self.remediator.inventory
        res = inv.resource(inv.job(job_id).resource_ids[0])
        device = inv.device(res.node, res.device_index)
        self.incidents += 1
        incident = f"incident-{self.incidents}"
        isolate(inv, device, LOST_DEVICE, incident, "device lost")
        self.cordoned.add((device.node, device.index))
        job = {j.job_id: j for j in jobs_on_device(inv, device)[0]}[job_id]
        outcome = checkpoint_job(
            inv, job, device_present=False, policy=LOST_DEVICE, incident_id=incident
        )
        after = inv.job(job_id)
        assert after.state == Q and after.info["remediation"]["incident"] == incident
        self.pending[job_id] = (job, outcome, reserve_target(inv, self.backend, job))

    def relaunch_job(self, job_id: str) -> None:
        """migrate_job on the reservation (its task retries it once on a conflict). Not
        for a job that ended meanwhile: migrate_job would place it again (failed or
        finished -> placed) - a known issue of tasks/remediation, reported; the remediator
        here gives its reservation back instead."""
        job, outcome, binding = self.pending.pop(job_id)
        if self.observer.job(job_id).state in (F, X):
            release_reservation(self.remediator.inventory, job_id, binding)
            return
        try:
            migrate_job(self.remediator, job, outcome, binding)  # type: ignore[arg-type]
        except JobTransitionError:
            migrate_job(self.remediator, job, outcome, binding)  # type: ignore[arg-type]

    def cancel_job(self, job_id: str, via: int) -> None:
        self.cancel_asked.add(job_id)
        if self.schedulers[via].cancel(job_id) == "cancelled":
            assert self.observer.job(job_id).state == X

    # ------------------------------------------------------------------ the invariants
    def observe(self) -> None:
        """Read the registry and the unexpired leases through the observer, check the
        invariants (test_lifecycle_machine.py's docstring), keep the jobs for the rules."""
        jobs = {r.job_id: r for r in self.observer.jobs()}
        leases = self.observer.leases()
        self.snap = jobs
        self.no_lost_job(jobs)
        self.one_live_attempt(jobs, leases)
        self.leases_have_live_attempts(jobs, leases)
        self.engines_agree()

    def engines_agree(self) -> None:
        """Each scheduler keeps its engine and applies what the change journal names: it
        must be the engine a fresh service rebuilds from the whole inventory."""
        fresh = SchedulerService(
            self.observer,
            self.backend,
            self.schedulers[0].config,
            now=self.clock,
            stop_grace_s=STOP_GRACE_S,
            lock_wait_s=0.0,
        )
        rebuilt = engine_state(fresh.refresh())
        for n, svc in enumerate(self.schedulers):
            assert engine_state(svc.refresh()) == rebuilt, f"scheduler {n}'s kept engine"

    def no_lost_job(self, jobs: dict[str, JobRecord]) -> None:
        assert set(jobs) == set(self.count)
        for job_id, record in jobs.items():
            phase = record.info.get("sched", {}).get("phase")
            if record.state == X:
                assert job_id in self.cancel_asked and phase == "cancelled", (job_id, phase)
            if record.state == F:
                assert job_id in self.finished, job_id
            if job_id in self.ended:
                assert record.state == self.ended[job_id], (job_id, record.state)
            elif record.state in (F, X):
                self.ended[job_id] = record.state
            if record.state in ACTIVE_STATES:
                assert record.resource_ids, job_id

    def one_live_attempt(self, jobs: dict[str, JobRecord], leases: list[Lease]) -> None:
        for job_id, record in jobs.items():
            runs = [r.run for r in self.runners if r.run is not None and r.run.job_id == job_id]
            live = [
                a for a in runs if a.attempt == record.attempt and record.state in ACTIVE_STATES
            ]
            assert len(live) <= 1, (job_id, [a.attempt for a in live])
            for a in runs:
                if a.attempt != record.attempt:
                    held = [x for x in leases if (x.owner, x.attempt) == (job_id, a.attempt)]
                    assert not held, f"{job_id} attempt {a.attempt} is stale but holds {held}"
        for lease in leases:
            record = jobs[lease.owner]
            assert lease.attempt == record.attempt or self.reserved(lease, record), lease

    def reserved(self, lease: Lease, record: JobRecord) -> bool:
        """Remediation's target for the job's next attempt, while the job waits."""
        pending = self.pending.get(lease.owner)
        binding = pending[2] if pending else None
        return (
            binding is not None
            and binding.resource.resource_id == lease.resource_id
            and lease.attempt == record.attempt + 1
            and record.state in WAITING_STATES
        )

    def leases_have_live_attempts(self, jobs: dict[str, JobRecord], leases: list[Lease]) -> None:
        for lease in leases:
            record = jobs[lease.owner]
            if lease.attempt == record.attempt:
                assert record.state in ACTIVE_STATES or record.state == Q, (lease, record.state)

    # ------------------------------------------------------------------ the end
    def close(self) -> None:
        for inv in [self.observer, self.remediator.inventory]:
            inv.close()
        for svc in self.schedulers:
            svc.inventory.close()
        for runner in self.runners:
            runner.inventory.close()

    def drain(self) -> None:
        """Every process gone, every device repaired, every lease and grace run out:
        passes and fresh runners then bring every job that was not cancelled to its end."""
        for runner in self.runners:
            runner.run = None
        self.pending.clear()
        for node, index in sorted(self.cordoned):
            self.observer.uncordon(node, index)
        self.cordoned.clear()
        self.clock.t += 2 * RESERVATION_TTL_S
        for _ in range(DRAIN_ROUNDS):
            self.schedulers[0].schedule_once()
            self.observe()
            for job_id in self.jobs_in(P):
                runner = self.runners[0]
                self.launch_job(runner, job_id)
                self.start_run(runner)
                if runner.run is not None:
                    self.train_step(runner)
                if runner.run is not None:
                    self.end_run(runner, stopped=False)
                self.observe()
            if not self.jobs_in(*ACTIVE_STATES, *WAITING_STATES):
                break
        left = {
            j: (r.state, r.info.get("sched", {}).get("phase"))
            for j, r in self.snap.items()
            if not (r.state == F or (r.state == X and j in self.cancel_asked))
        }
        assert not left, f"jobs that never finished: {left}"
