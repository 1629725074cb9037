"""Invariants under random sequences of submit, schedule, finish, fail, cordon, preempt.

- no unit (device or partition) is held by two jobs, nor listed free while taken;
- no gang mixes SKUs, regions or kinds of unit;
- no job is lost: each submitted job is queued, reserved, running, stopping or done;
- capacity is accounted exactly: every unit is free, running, held, or unavailable.
"""

from __future__ import annotations

from gpuflow.tasks.scheduling.model import (
    DONE_STATES,
    LIVE_STATES,
    JobRequest,
    Placement,
    Preemption,
    SubmissionRefused,
)
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.tasks.scheduling.helpers import A100, DCU, V100, make_engine

SHAPES = st.one_of(
    st.builds(dict, count=st.integers(1, 4), skus=st.sampled_from([(), ("a100-40gb",), ("v100",)])),
    st.builds(dict, count=st.integers(1, 3), profile=st.sampled_from(["1g.5gb", "3g.20gb"])),
    st.builds(dict, count=st.integers(1, 2), max_count=st.just(4)),
    st.builds(dict, count=st.sampled_from([2, 4]), nodes=st.just(2)),  # a gang over 2 nodes
    st.builds(
        dict,
        profile=st.just("vdcu"),
        compute_units=st.sampled_from([10, 30]),
        memory_mb=st.sampled_from([4096, 16384]),
    ),
)


class Scheduling(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.engine = make_engine(
            [
                ("a0", "r1", A100, 2),
                ("a1", "r1", A100, 2),
                ("v0", "r2", V100, 2),
                ("d0", "r2", DCU, 1),
            ],
            queue_depth=6,
        )
        self.now = 0.0
        self.submitted: set[str] = set()
        self.n = 0

    def _ids(self, *states: str) -> list[str]:
        return sorted(j.job_id for j in self.engine.jobs.values() if j.state in states)

    @rule(
        shape=SHAPES,
        priority=st.integers(0, 3),
        region=st.sampled_from([None, "r1", "r2"]),
        spill=st.booleans(),
        reserve=st.booleans(),
    )
    def submit(
        self, shape: dict, priority: int, region: str | None, spill: bool, reserve: bool
    ) -> None:
        self.n += 1
        job_id = f"j{self.n}"
        req = JobRequest(
            job_id=job_id,
            priority=priority,
            region=region,
            allow_spill=spill,
            # A gang that names its nodes is never a reservation (JobRequest refuses it).
            start_at_s=self.now + 50 if reserve and "nodes" not in shape else None,
            **shape,
        )
        try:
            self.engine.submit(req, self.now, checkpoint_every_s=30.0)
        except SubmissionRefused:
            return  # refused up front (impossible shape or a full queue): never admitted
        self.submitted.add(job_id)

    @rule(dt=st.floats(1, 40))
    def schedule(self, dt: float) -> None:
        self.now += dt
        for d in self.engine.schedule(self.now):
            if isinstance(d, Placement) and d.repartition:
                for step in d.repartition:
                    created = [
                        (
                            f"{step.device_uuid}/p{self.n}.{k}.{self.now}",
                            r,
                            r.memory_mb or 5120,
                            r.compute_units,
                        )
                        for k, r in enumerate(step.create)
                    ]
                    self.engine.apply_repartition(step, created)
            elif isinstance(d, Preemption):
                for e in d.evictions:
                    assert self.engine.jobs[e.job_id].priority < self.engine.jobs[d.job_id].priority

    @precondition(lambda self: any(j.state == "running" for j in self.engine.jobs.values()))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self._ids("running")))
        self.engine.finish(job_id, self.now)

    @precondition(
        lambda self: any(j.state in ("running", "stopping") for j in self.engine.jobs.values())
    )
    @rule(data=st.data(), requeue=st.booleans())
    def fail(self, data: st.DataObject, requeue: bool) -> None:
        job_id = data.draw(st.sampled_from(self._ids("running", "stopping")))
        self.engine.fail(job_id, self.now, requeue=requeue)

    @precondition(lambda self: any(j.state == "stopping" for j in self.engine.jobs.values()))
    @rule(data=st.data())
    def ack_stop(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self._ids("stopping")))
        self.engine.stopped(job_id, self.now, f"ckpt-{self.now}")

    @precondition(
        lambda self: any(j.state in ("queued", "reserved") for j in self.engine.jobs.values())
    )
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self._ids("queued", "reserved")))
        self.engine.cancel(job_id, self.now)

    @rule(
        node=st.sampled_from(["a0", "a1", "v0", "d0"]),
        index=st.sampled_from([None, 0, 1]),
        on=st.booleans(),
    )
    def cordon(self, node: str, index: int | None, on: bool) -> None:
        if node == "d0" and index == 1:
            index = 0
        self.engine.cordon(node, index, cordoned=on)

    @rule(
        node=st.sampled_from(["a0", "a1", "v0"]),
        index=st.sampled_from([0, 1]),
        healthy=st.booleans(),
    )
    def health(self, node: str, index: int, healthy: bool) -> None:
        self.engine.set_health(node, index, healthy)

    @invariant()
    def engine_audit(self) -> None:
        assert self.engine.audit() == []

    @invariant()
    def no_job_lost(self) -> None:
        assert set(self.engine.jobs) == self.submitted
        for job in self.engine.jobs.values():
            assert job.state in LIVE_STATES + DONE_STATES
            if job.state in ("running", "stopping"):
                units = list(job.allocation.values())
                assert len({(u.dev.region, u.dev.sku, u.kind, u.profile) for u in units}) == 1

    @invariant()
    def capacity_accounted(self) -> None:
        fleet = self.engine.fleet
        free = {u.rid for u in fleet.free_units()}
        running = {r for j in self.engine.jobs.values() for r in j.allocation}
        held = {r for j in self.engine.jobs.values() for r in j.holds}
        assert not (free & running) and not (free & held) and not (running & held)
        for rid, unit in fleet.units.items():
            if rid in free or rid in running or rid in held:
                continue
            # Neither free nor claimed: it must be unavailable for a reason the index knows.
            dev = unit.dev
            assert (
                not dev.available
                or dev.pending_for is not None
                or (unit.kind == "device" and dev.parts)
                or (unit.kind != "device" and not dev.whole.free)
            ), rid
        for pool in fleet.pools.values():
            assert pool.whole_free == sum(len(v) for v in pool.node_free.values())


Scheduling.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestScheduling = Scheduling.TestCase
