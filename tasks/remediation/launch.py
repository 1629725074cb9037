"""How a job is started again somewhere else: its launch record, and an in-process runner.

Remediation can only resume a job it knows how to start. Whoever starts a job leaves a
*launch record* in the job's inventory entry (``remember_launch``): the TrainSpec, where
its checkpoints live (never a secret: a saved block's name, or the non-secret fields),
what device it asked for, its MLflow run, and which kind of launcher (tasks/launching.py)
runs it:

* ``in-process`` - ``InProcessLauncher`` over ``InProcessRunner``: the job's training loop
  in a thread of this process (tests, the demo, a long-lived agent). A relaunch is another
  thread, logging to the same MLflow run, so the loss curve of a moved job is one curve.
* ``deployment`` - ``DeploymentLauncher``: the `train` deployment, which resumes from the
  latest checkpoint by itself; one flow run per (job, attempt), whoever asks how often.

A job without a launch record is still checkpointed and queued; an operator resumes it
with `gpuflow train` under the same job id.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.blocks.gpu_cluster import GpuCluster
from gpuflow.hardware.backend import (
    Backend,
    DeviceLostError,
    HardwareError,
    InvalidRequestError,
)
from gpuflow.hardware.health import health_status
from gpuflow.hardware.inventory import Inventory, JobState, LeaseError, LeaseLostError
from gpuflow.tasks.launching import (
    TRAIN_DEPLOYMENT,
    AlreadyLaunchedError,
    DeploymentLauncher,
    Launcher,
    LaunchError,
    LaunchOrder,
    LaunchReceipt,
    pin_units,
    storage_fields,
)
from gpuflow.tasks.training.binding import Binding, DeviceRequest, bind_held_lease
from gpuflow.tasks.training.loop import StepInfo, TrainResult
from gpuflow.tasks.training.spec import TrainSpec

log = logging.getLogger(__name__)

LAUNCHERS = ("in-process", "deployment")

CrashHandler = Callable[[str, str, BaseException], Any]  # (job id, "node:index", error)

__all__ = ["LAUNCHERS", "TRAIN_DEPLOYMENT", "CrashHandler", "LaunchError", "relaunch"]


# -- launch records ---------------------------------------------------------------------


def storage_record(storage: CheckpointStorage) -> dict[str, Any]:
    """Where the checkpoints are, without secrets: a saved block by name, else its fields."""
    name = getattr(storage, "_block_document_name", None)
    if name:
        return {"block": name}
    return {"fields": storage_fields(storage)}


def storage_from_record(record: dict[str, Any]) -> CheckpointStorage:
    if record.get("block"):
        return CheckpointStorage.load(record["block"])
    return CheckpointStorage(**record.get("fields", {}))


def remember_launch(
    inventory: Inventory,
    spec: TrainSpec,
    storage: CheckpointStorage,
    device: DeviceRequest,
    *,
    launcher: str,
    run_id: str | None = None,
    deployment: str = TRAIN_DEPLOYMENT,
) -> dict[str, Any]:
    """Write the job's launch record into its inventory entry (the job must be recorded)."""
    if launcher not in LAUNCHERS:
        raise InvalidRequestError(f"launcher {launcher!r} is not one of: {', '.join(LAUNCHERS)}")
    record = {
        "launcher": launcher,
        "train_spec": spec.model_dump(),
        "storage": storage_record(storage),
        "device": device.model_dump(),
        "run_id": run_id,
        "deployment": deployment,
    }
    inventory.transition_job(spec.job_id, launch=record)  # fields only: the state stays
    return record


# -- crashes ------------------------------------------------------------------------------


def crash_is_hardware(error: BaseException, backend: Backend, node: str, index: int) -> bool:
    """Whether a job died with its device (then remediation resumes it elsewhere).

    A lease taken away (a fenced job) or a refused request is not the device's fault; an
    application error on a healthy device would crash again anywhere, so it is left to
    the job's owner. The device itself decides the rest.
    """
    if isinstance(error, DeviceLostError):
        return True
    if isinstance(error, LeaseError | InvalidRequestError):
        return False
    try:
        sample = backend.telemetry(node, index)
    except DeviceLostError:
        return True
    except HardwareError:
        return isinstance(error, HardwareError)
    return health_status(sample).level in ("critical", "lost")


# -- the in-process runner -----------------------------------------------------------------


@dataclass
class Segment:
    """One stretch of a job on one device."""

    resource_id: str
    device: str  # node:index
    started_at_s: float
    first_step: int | None = None  # the first step this stretch trained
    last_step: int | None = None
    resumed_from_step: int | None = None
    stopped_by_request: bool = False
    error: str | None = None
    ended_at_s: float | None = None


@dataclass
class JobHandle:
    job_id: str
    spec: TrainSpec
    storage: CheckpointStorage
    device: DeviceRequest
    run_id: str | None
    on_crash: CrashHandler | None
    segments: list[Segment] = field(default_factory=list)
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, loss), every step
    result: TrainResult | None = None
    error: str | None = None
    step_hooks: list[Callable[[StepInfo], None]] = field(default_factory=list)
    _done: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.result is not None and self.result.steps_done >= self.spec.steps

    def wait(self, timeout_s: float) -> bool:
        """True once the job finished (or failed for good) within ``timeout_s``."""
        return self._done.wait(timeout_s)

    @property
    def alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)


class InProcessRunner:
    """Training jobs in threads of this process, resumable by remediation."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobHandle] = {}
        self._lock = threading.Lock()

    def handle(self, job_id: str) -> JobHandle | None:
        with self._lock:
            return self._jobs.get(job_id)

    def start(
        self,
        spec: TrainSpec,
        storage: CheckpointStorage,
        cluster: GpuCluster,
        device: DeviceRequest | None = None,
        *,
        run_id: str | None = None,
        on_crash: CrashHandler | None = None,
        step_hooks: tuple[Callable[[StepInfo], None], ...] = (),
    ) -> JobHandle:
        """Lease a device for a new job (as the `train` flow does) and train it in a thread."""
        from gpuflow.tasks.training.job import acquire

        device = device or DeviceRequest()
        with self._lock:
            if spec.job_id in self._jobs and self._jobs[spec.job_id].alive:
                raise InvalidRequestError(f"job {spec.job_id!r} is already running in this process")
        binding = acquire(cluster, device, spec.job_id)
        handle = JobHandle(
            spec.job_id, spec, storage, device, run_id, on_crash, step_hooks=list(step_hooks)
        )
        remember_launch(
            cluster.get_inventory(), spec, storage, device, launcher="in-process", run_id=run_id
        )
        with self._lock:
            self._jobs[spec.job_id] = handle
        self._spawn(handle, binding, cluster)
        return handle

    def resume(
        self,
        job_id: str,
        binding: Binding,
        cluster: GpuCluster,
        record: dict[str, Any] | None = None,
        on_crash: CrashHandler | None = None,
    ) -> JobHandle:
        """Train ``job_id`` on ``binding`` (already leased to it) from its latest checkpoint.

        A job this process never saw is rebuilt from its launch ``record``.
        """
        with self._lock:
            handle = self._jobs.get(job_id)
        if handle is None:
            if not record:
                raise LaunchError(
                    f"job {job_id!r} is not known to this process and has no launch record"
                )
            handle = JobHandle(
                job_id,
                TrainSpec(**record["train_spec"]),
                storage_from_record(record["storage"]),
                DeviceRequest(**record.get("device", {})),
                record.get("run_id"),
                on_crash,
            )
            with self._lock:
                self._jobs[job_id] = handle
        if handle.alive and not handle.segments[-1].ended_at_s:
            raise LaunchError(f"job {job_id!r} still runs on {handle.segments[-1].device}")
        inventory = cluster.get_inventory()
        attempt, resource_id = binding.lease.attempt, binding.resource.resource_id
        current = inventory.job(job_id)
        if current.attempt != attempt:
            # The new attempt, whose leases the binding holds; a still-active older attempt
            # on the dead device is superseded (marked lost).
            inventory.place_job(job_id, [resource_id], attempt=attempt, supersede=True)
        elif current.state != JobState.PLACED:
            raise AlreadyLaunchedError(f"job {job_id!r} attempt {attempt} was already started")
        elif resource_id not in current.resource_ids:
            raise LaunchError(f"job {job_id!r} attempt {attempt} is placed on other resources")
        if not inventory.mark_launching(job_id, attempt):
            raise AlreadyLaunchedError(f"job {job_id!r} attempt {attempt} was already started")
        self._spawn(handle, binding, cluster)
        return handle

    def _spawn(self, handle: JobHandle, binding: Binding, cluster: GpuCluster) -> None:
        res = binding.resource
        segment = Segment(res.resource_id, f"{res.node}:{res.device_index}", time.time())
        handle.segments.append(segment)
        thread = threading.Thread(
            target=self._run,
            args=(handle, segment, binding, cluster),
            name=f"gpuflow-job-{handle.job_id}-{len(handle.segments)}",
            daemon=False,  # a job is not killed because its starter returned
        )
        handle._threads.append(thread)
        thread.start()

    def _run(
        self, handle: JobHandle, segment: Segment, binding: Binding, cluster: GpuCluster
    ) -> None:
        from gpuflow.tasks.training.job import release, run_training

        def record(info: StepInfo) -> None:
            if segment.first_step is None:
                segment.first_step = info.step
            segment.last_step = info.step
            handle.losses.append((info.step, info.loss))
            for hook in handle.step_hooks:
                hook(info)

        error: BaseException | None = None
        result: TrainResult | None = None
        try:
            result = run_training(
                handle.spec, handle.storage, cluster, binding, handle.run_id, (record,)
            )
        except BaseException as exc:  # noqa: BLE001 - a job's death is data here
            error = exc
        finally:
            try:
                release(cluster, binding, handle.job_id)
            except Exception:  # noqa: BLE001 - the lease expires by itself
                log.exception("job %s: could not release %s", handle.job_id, segment.device)
            segment.ended_at_s = time.time()
        if result is not None:
            segment.resumed_from_step = result.resumed_from_step
            segment.stopped_by_request = result.stopped_by_request
            handle.result = result
            if not result.stopped_by_request:
                handle._done.set()  # finished; a stopped job waits for its relaunch
            return
        assert error is not None
        segment.error = f"{type(error).__name__}: {error}"
        self._crashed(handle, segment, binding, cluster, error)

    def _crashed(
        self,
        handle: JobHandle,
        segment: Segment,
        binding: Binding,
        cluster: GpuCluster,
        error: BaseException,
    ) -> None:
        res = binding.resource
        inventory = cluster.get_inventory()
        where = f"{res.node}:{res.device_index}"
        if isinstance(error, LeaseLostError):
            # Fenced: a newer attempt owns the job; this one writes nothing more.
            log.warning(
                "job %s attempt %d was fenced on %s", handle.job_id, binding.lease.attempt, where
            )
            return  # like a stop on request: the handle waits for the newer attempt
        if not crash_is_hardware(error, cluster.get_backend(), res.node, res.device_index):
            log.error("job %s failed on %s (not a device fault): %s", handle.job_id, where, error)
            inventory.transition_job(
                handle.job_id,
                JobState.FAILED,
                expect_attempt=binding.lease.attempt,
                error=segment.error,
            )
            handle.error = segment.error
            handle._done.set()
            return
        log.warning("job %s crashed with its device %s: %s", handle.job_id, where, error)
        # Queued for remediation, marked with the device so remediation takes it over.
        inventory.requeue_job(
            handle.job_id,
            JobState.LOST,
            expect_attempt=binding.lease.attempt,
            remediation={
                "device_uuid": res.device_uuid,
                "cause": "crash",
                "error": segment.error[:500],
                "at_s": time.time(),
            },
        )
        if handle.on_crash is None:
            return
        try:
            handle.on_crash(handle.job_id, where, error)
        except Exception as exc:  # noqa: BLE001 - reported, the job stays queued
            log.exception("job %s: remediation after the crash failed", handle.job_id)
            handle.error = f"remediation failed: {exc}"
            handle._done.set()


RUNNER = InProcessRunner()


# -- relaunch -----------------------------------------------------------------------------


class InProcessLauncher(Launcher):
    """A launch order run by ``RUNNER`` in a thread of this process.

    The order's lease must be held by the job's attempt (remediation's reservation, or a
    scheduling pass's placement); a job this process never saw is rebuilt from its launch
    ``record``. Of two launchers of one attempt, the one that moves it to launching runs it.
    """

    name = "in-process"

    def __init__(
        self,
        cluster: GpuCluster,
        record: dict[str, Any] | None,
        on_crash: CrashHandler | None = None,
        runner: InProcessRunner | None = None,
    ) -> None:
        self.cluster, self.record, self.on_crash = cluster, record, on_crash
        self.runner = runner or RUNNER

    def launch(self, order: LaunchOrder) -> LaunchReceipt:
        binding = _binding_of(self.cluster, order)
        try:
            self.runner.resume(
                order.job_id, binding, self.cluster, record=self.record, on_crash=self.on_crash
            )
        except AlreadyLaunchedError:
            return LaunchReceipt(self.name, order.job_id, order.attempt, started=False)
        return LaunchReceipt(self.name, order.job_id, order.attempt, started=True)


def _binding_of(cluster: GpuCluster, order: LaunchOrder) -> Binding:
    """The order's resource bound to torch, on the lease its attempt holds."""
    inventory = cluster.get_inventory()
    binding = bind_held_lease(
        inventory, cluster.get_backend(), order.resource_id, order.job_id, order.attempt
    )
    if binding is None:
        lease = inventory.lease(order.resource_id)
        held = f"{lease.owner} attempt {lease.attempt}" if lease else "nobody"
        raise LaunchError(
            f"job {order.job_id!r} attempt {order.attempt} does not hold {order.resource_id} "
            f"(held by {held})"
        )
    return binding


def relaunch(
    job_id: str,
    launch: dict[str, Any] | None,
    reservation: Any,  # targets.Reservation: its units, leased to the job's next attempt
    cluster: GpuCluster,
    on_crash: CrashHandler | None = None,
) -> dict[str, Any]:
    """Start ``job_id`` again on ``reservation`` (leased to its next attempt) with the kind
    of launcher its launch record names; a gang on all its reserved units.

    Returns what was started. Raises LaunchError when the job cannot be started here;
    the leases are then still held by the job id: the caller releases them.
    """
    if not launch:
        raise LaunchError(
            f"job {job_id!r} has no launch record: it stays checkpointed and queued; resume it "
            f"with `gpuflow train --job-id {job_id}` (same job id: it resumes from its checkpoint)"
        )
    kind = launch.get("launcher")
    res = reservation.resource
    where = {
        "node": res.node,
        "device_index": res.device_index,
        "resource_id": res.resource_id,
        "resource_ids": list(reservation.resource_ids),
    }
    order = LaunchOrder(job_id, reservation.lease.attempt, res.resource_id, res.node)
    if kind == InProcessLauncher.name:
        if len(reservation.resource_ids) > 1:
            # In-process jobs are one-unit jobs (InProcessRunner.start leases one device);
            # a gang's ranks run under torchelastic, launched by the `train` flow.
            raise LaunchError(
                f"job {job_id!r} is a gang of {len(reservation.resource_ids)}: it relaunches "
                "through the `train` deployment, not in this process; it stays checkpointed "
                "and queued for the scheduler"
            )
        receipt = InProcessLauncher(cluster, launch, on_crash).launch(order)
    elif kind == DeploymentLauncher.name:
        receipt = _relaunch_deployment(launch, order, reservation, cluster)
    else:
        raise LaunchError(f"job {job_id!r} has an unknown launcher {kind!r}")
    return {**receipt.to_dict(), **where}


def _relaunch_deployment(
    launch: dict[str, Any], order: LaunchOrder, reservation: Any, cluster: GpuCluster
) -> LaunchReceipt:
    launcher = DeploymentLauncher(launch.get("deployment") or TRAIN_DEPLOYMENT)
    storage = storage_fields(storage_from_record(launch["storage"]))
    # Pinned to the units remediation chose, and sent to the work queue of the worker that
    # owns their node (when workers own nodes), so the job resumes exactly there.
    order = LaunchOrder(
        order.job_id,
        order.attempt,
        order.resource_id,
        order.node,
        parameters={
            "spec": launch["train_spec"],
            "device": pin_units(reservation.resource_ids),
            "storage": storage,
        },
    )
    placed = cluster.get_inventory().job(order.job_id)
    if placed.attempt != order.attempt:
        # The train flow leases for itself (through the scheduler): free our reservation
        # just before it looks. A placement already made for this attempt (a scheduling
        # pass took the job) stays: the flow run finds it.
        for rid in reservation.resource_ids:
            cluster.get_inventory().release_lease(rid, order.job_id)
    return launcher.launch(order)
