"""The training loop, readable top to bottom.

Components are swappable units around it (torchtitan style): the model and data come
from the registry, precision from AutoPrecision, checkpoints from CheckpointManager over
any CheckpointStore, device utilization from a probe over the hardware layer, and the
job control channel from the inventory. The loop imports neither Prefect nor MLflow:
flows add those through ``hooks``.

Exactness: everything a step depends on is in the checkpoint (model, optimizer, scaler,
every RNG, the sampler's position, the precision policy's state), so on CPU in fp32 a
run that is killed and resumed ends with the same bits as one that never stopped.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from gpuflow.hardware.skus import SkuSpec
from gpuflow.tasks.training.autoprecision import AutoPrecision, Switch
from gpuflow.tasks.training.checkpoint import LAYOUT_DCP, CheckpointManager, model_fingerprint
from gpuflow.tasks.training.data import build_dataset, eval_batches, make_sampler
from gpuflow.tasks.training.guard import judge, refuse_nonfinite_weights, total_grad_norm
from gpuflow.tasks.training.models import build_model, lm_loss, model_spec
from gpuflow.tasks.training.parallel import SINGLE, Parallel
from gpuflow.tasks.training.precision import validate_policy
from gpuflow.tasks.training.prefetch import DevicePrefetcher
from gpuflow.tasks.training.spec import TrainSpec
from gpuflow.tasks.training.storage import CheckpointStore

log = logging.getLogger(__name__)

CHECKPOINT_NOW = "checkpoint-now"
CHECKPOINT_AND_STOP = "checkpoint-and-stop"


class UtilizationProbe(Protocol):
    """Device utilization as the hardware reports it (None: no fresh reading), and the
    step's pacing (utilization.DeviceUtilization.pace: what the twin's clock adds)."""

    def observe_step(self, busy_s: float, wall_s: float) -> float | None: ...

    def pace(self, busy_s: float, key: str = "") -> float: ...


class ControlChannel(Protocol):
    """The per-job control channel (the inventory implements it)."""

    def poll_control(self, job_id: str) -> Any | None: ...

    def ack_control(self, request_id: Any, checkpoint_id: str) -> Any: ...


@dataclass(frozen=True)
class StepInfo:
    # 1-based: the number of steps done, a skipped one included (as GradScaler counts)
    step: int
    loss: float
    precision: str
    step_time_s: float
    samples_per_s: float
    tokens_per_s: float | None
    utilization_ratio: float | None
    switch: Switch | None
    grad_norm: float | None = None  # total L2 norm before clipping (None: not taken)
    skipped: str | None = None  # why the numeric guard skipped this optimizer step


@dataclass
class TrainResult:
    job_id: str
    model: str
    steps_done: int
    resumed_from_step: int
    stopped_by_request: bool
    final_loss: float
    eval_loss: float | None
    wall_time_s: float
    train_time_s: float  # time inside steps only (comparable across runs)
    switches: list[Switch] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    last_checkpoint: str | None = None
    # Steps the numeric guard skipped, as {"step", "reason", "precision"} (plain dicts, so
    # a gang's result, rebuilt from rank 0's dict, carries them unchanged).
    skips: list[dict[str, Any]] = field(default_factory=list)
    # auto's A/B outcomes (ab_probe.Decision.to_dict()), the evidence behind its switches.
    decisions: list[dict[str, Any]] = field(default_factory=list)
    # What the job's devices drew (tasks.energy.job_energy: energy_j, average_power_w,
    # energy_per_sample_j, the tuner's choice); empty where nothing measured it.
    energy: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        d["switches"] = [s.to_dict() for s in self.switches]
        return d


@dataclass
class Workload:
    """Everything built from a spec: model, optimizer, data, precision, loss."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    sampler: Any
    eval_set: list[tuple[torch.Tensor, torch.Tensor]]
    precision: AutoPrecision
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    tokens_per_sample: int | None
    fingerprint: str


def build_workload(
    spec: TrainSpec, device: torch.device, sku: SkuSpec | None = None, world_size: int = 1
) -> Workload:
    """Model, optimizer, data and precision for ``spec``; validates before anything runs.

    ``world_size``: the gang's (the precision policy's A/B evidence holds for one size)."""
    validate_policy(spec.precision, device, sku)  # fp16/bf16 asked of a device without it
    mspec = model_spec(spec.model)
    model = build_model(spec.model, seed=spec.seed).to(device)
    if mspec.optimizer == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(
            model.parameters(), lr=spec.resolved_lr, momentum=0.9, weight_decay=mspec.weight_decay
        )
    else:
        # Left to itself AdamW runs its per-parameter for-loop on CPU (~15 kernels per
        # tensor). fused=True is one kernel per parameter on every device torch has one for
        # (byte-lm's update on the 2-core EPYC: 6.8 ms -> 1.5 ms; foreach 5.5 ms);
        # foreach elsewhere. Both are deterministic, and the state dict is the same.
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        fused = device.type in _get_fused_kernels_supported_devices()
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=spec.resolved_lr,
            weight_decay=mspec.weight_decay,
            **({"fused": True} if fused else {"foreach": True}),
        )
    dataset = build_dataset(spec.resolved_dataset, seed=spec.seed)
    seq_len = spec.resolved_seq_len
    sampler = make_sampler(
        dataset, batch_size=spec.resolved_batch_size, seed=spec.seed, seq_len=seq_len
    )
    if device.type == "cuda":
        sampler = DevicePrefetcher(sampler, device)  # pinned, copied a step ahead
    evals = eval_batches(
        dataset, batch_size=spec.resolved_batch_size, seq_len=seq_len, max_batches=spec.eval_batches
    )
    loss_fn = lm_loss if mspec.task == "lm" else F.cross_entropy
    return Workload(
        model=model,
        optimizer=optimizer,
        sampler=sampler,
        eval_set=evals,
        precision=AutoPrecision(spec.precision, device, sku, world_size=world_size),
        loss_fn=loss_fn,
        tokens_per_sample=seq_len,
        fingerprint=model_fingerprint(model),
    )


def evaluate(w: Workload, device: torch.device) -> float:
    """Mean loss on the fixed eval set, in fp32 so policies are compared on equal terms."""
    w.model.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for x, y in w.eval_set:
            total += float(w.loss_fn(w.model(x.to(device)), y.to(device))) * len(x)
            n += len(x)
    w.model.train()
    return total / max(n, 1)


def train_loop(
    spec: TrainSpec,
    store: CheckpointStore,
    *,
    device: torch.device | str = "cpu",
    sku: SkuSpec | None = None,
    utilization: UtilizationProbe | None = None,
    control: ControlChannel | None = None,
    hooks: Sequence[Callable[[StepInfo], None]] = (),
    on_checkpoint: Callable[[str, int], None] | None = None,
    guard: Callable[[], None] | None = None,
    fencing_token: int | None = None,
    parallel: Parallel = SINGLE,
) -> TrainResult:
    """Train ``spec`` from its latest checkpoint (or from scratch) up to ``spec.steps``.

    ``guard`` runs before every step and every checkpoint; it raises (LeaseLostError) to
    stop a run that may no longer write. ``fencing_token`` goes into every checkpoint's
    manifest; the store refuses a save older than its newest (a stale attempt).
    ``parallel``: one process (the default) or this rank's view of a gang
    (tasks/training/distributed/): hooks, the control channel and ``on_checkpoint`` are
    rank 0's alone; every rank acts on rank 0's decisions.
    """
    with _deterministic_if(spec.compile, torch.device(device)):
        return _train(
            spec,
            store,
            device=device,
            sku=sku,
            utilization=utilization,
            control=control,
            hooks=hooks,
            on_checkpoint=on_checkpoint,
            guard=guard,
            fencing_token=fencing_token,
            parallel=parallel,
        )


@contextlib.contextmanager
def _deterministic_if(on: bool, device: torch.device) -> Iterator[None]:
    # Inductor's generated backward adds with atomics inside parallel loops: two compiled
    # runs differ in the last bits, so a resumed one could not equal one that never
    # stopped. Deterministic algorithms make them equal on CPU (measured: 20 of 20 steps
    # bitwise; tested). On CUDA some kernels have no deterministic variant (and cuBLAS
    # wants CUBLAS_WORKSPACE_CONFIG set before it starts): they warn instead of failing.
    if not on:
        yield
        return
    before = torch.are_deterministic_algorithms_enabled()
    before_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=device.type != "cpu")
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=before_warn)


def _train(
    spec: TrainSpec,
    store: CheckpointStore,
    *,
    device: torch.device | str,
    sku: SkuSpec | None,
    utilization: UtilizationProbe | None,
    control: ControlChannel | None,
    hooks: Sequence[Callable[[StepInfo], None]],
    on_checkpoint: Callable[[str, int], None] | None,
    guard: Callable[[], None] | None,
    fencing_token: int | None,
    parallel: Parallel,
) -> TrainResult:
    started = time.perf_counter()
    device = torch.device(device)
    w = build_workload(spec, device, sku, parallel.world_size)
    manager = CheckpointManager(
        store,
        spec.job_id,
        keep_last=spec.keep_last,
        expected_model=w.fingerprint,
        fencing_token=fencing_token,
    )
    # One process writes CheckpointManager's files; a gang writes DCP shards under it.
    ckpt = parallel.checkpointer(manager, on_checkpoint if parallel.primary else None)
    check = guard or (lambda: None)
    meta = {"model_name": spec.model, "model_fingerprint": w.fingerprint, "spec": spec.model_dump()}

    # Resume: the newest checkpoint that verifies (corrupt ones are skipped inside).
    step = 0
    restored = ckpt.restore(w)
    if restored is not None:
        step = restored[1]
        log.info("job %s resumes from %s (step %d)", spec.job_id, restored[0], step)
    resumed_from = step
    if restored is None:
        torch.manual_seed(spec.seed)  # the data order is seeded in the sampler already
    net = parallel.wrap(w.model)  # after the restore: every rank starts from the same bits
    if spec.compile:
        # The forward (and so its backward) only: w.model stays the eager module, so
        # checkpoints, the fingerprint and evaluate() (eager: a no_grad call would
        # recompile) see the plain parameter names.
        net = torch.compile(net)

    checkpoints: list[str] = []

    def save(at_step: int, blocking: bool = True) -> str:
        check()
        # The guard keeps weights finite; this is the last line of defence, so keep_last
        # never rotates the good checkpoints out for poisoned ones.
        refuse_nonfinite_weights(w.model, at_step)
        cid = ckpt.save(w, at_step, meta, blocking=blocking)
        checkpoints.append(cid)
        return cid

    stopped = False
    loss_value = math.nan
    train_time_s = 0.0
    batch = spec.resolved_batch_size
    w.model.train()
    while step < spec.steps:
        check()
        t_wall = time.perf_counter()
        x, y = parallel.shard(*next(w.sampler))
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)

        t_busy = time.perf_counter()
        with w.precision.autocast():
            loss = w.loss_fn(net(x), y)
        w.optimizer.zero_grad(set_to_none=True)
        w.precision.scale(loss).backward()
        # The numeric guard, before the step: unscaled gradients (so the norm and any
        # clipping see true values), then the global batch's loss (the mean over the
        # ranks: non-finite on every rank when it is on any) and the norm of the
        # synchronized gradients judged, so every rank of a gang skips the same steps.
        w.precision.unscale_(w.optimizer)
        loss_value = parallel.mean(float(loss.detach()))  # the global batch's loss
        grad_norm = total_grad_norm(w.model.parameters(), spec.grad_clip_norm)
        verdict = judge(loss_value, grad_norm, scaled=w.precision.scaled_this_step)
        if verdict.skip:
            # Nothing of this batch may reach the weights or the optimizer's moments.
            w.optimizer.zero_grad(set_to_none=True)
        w.precision.step(w.optimizer, skip=verdict.skip)
        overflowed = w.precision.update()
        if w.precision.probing and device.type == "cuda":
            # An A/B times whole steps: without this the optimizer's kernels, still queued,
            # would land in the next step's time (and in the other arm's at a block's end).
            torch.cuda.synchronize(device)
        if utilization is not None:
            # The twin's clock (see pace), per precision in force (AutoPrecision's A/B).
            utilization.pace(time.perf_counter() - t_busy, w.precision.current)
        busy_s = time.perf_counter() - t_busy
        train_time_s += busy_s
        step += 1

        util = (
            utilization.observe_step(busy_s, time.perf_counter() - t_wall) if utilization else None
        )
        # Every rank acts on rank 0's readings (utilization and step time, in one
        # broadcast), so the precision policy decides as rank 0 does, at the same step
        # everywhere (the loss is the global batch's already).
        util, timed_s = parallel.agree((util, busy_s))
        switch = w.precision.observe(
            step, util, loss_value, overflowed, skipped=verdict.reason, step_time_s=timed_s
        )
        info = StepInfo(
            step=step,
            loss=loss_value,
            precision=w.precision.current,
            step_time_s=busy_s,
            samples_per_s=batch / busy_s if busy_s > 0 else math.inf,
            tokens_per_s=(batch * w.tokens_per_sample / busy_s)
            if w.tokens_per_sample and busy_s > 0
            else None,
            utilization_ratio=util,
            switch=switch,
            grad_norm=grad_norm,
            skipped=verdict.reason,
        )
        for hook in hooks if parallel.primary else ():
            hook(info)

        # The control channel: remediation and preemption ask for a checkpoint here. Rank
        # 0 polls it; every rank checkpoints (and stops) on what rank 0 read.
        request = control.poll_control(spec.job_id) if control and parallel.primary else None
        request = parallel.agree(request)
        if request is not None:
            cid = save(step)
            if parallel.primary:
                control.ack_control(request.request_id, cid)  # type: ignore[union-attr]
            log.info("job %s: %s acknowledged with %s", spec.job_id, request.action, cid)
            if request.action == CHECKPOINT_AND_STOP:
                stopped = True
                break
            continue
        if step % spec.checkpoint_interval == 0 or step == spec.steps:
            save(step, blocking=step == spec.steps)

    ckpt.flush()  # an async save still in flight commits before the result says it did
    eval_loss = None if stopped else evaluate(w, device)
    return TrainResult(
        job_id=spec.job_id,
        model=spec.model,
        steps_done=step,
        resumed_from_step=resumed_from,
        stopped_by_request=stopped,
        final_loss=loss_value,
        eval_loss=eval_loss,
        wall_time_s=time.perf_counter() - started,
        train_time_s=train_time_s,
        switches=list(w.precision.switches),
        skips=[s.to_dict() for s in w.precision.skips],
        decisions=[d.to_dict() for d in w.precision.decisions],
        checkpoints=checkpoints,
        last_checkpoint=checkpoints[-1] if checkpoints else (restored[0] if restored else None),
    )


def trained_model(
    spec: TrainSpec, store: CheckpointStore, device: torch.device | str = "cpu"
) -> torch.nn.Module:
    """The model of ``spec`` with the weights of its latest checkpoint (one process's or a
    gang's)."""
    model = build_model(spec.model, seed=spec.seed).to(device)
    ckpt = CheckpointManager(store, spec.job_id, keep_last=spec.keep_last)
    committed = ckpt.committed()
    if not committed:
        raise FileNotFoundError(f"job {spec.job_id!r} has no checkpoint in {store!r}")
    if committed[0][1].get("layout") == LAYOUT_DCP:
        import tempfile

        from gpuflow.tasks.training.distributed.checkpoint import load_model_weights

        with tempfile.TemporaryDirectory(prefix="gpuflow-weights-") as scratch:
            load_model_weights(ckpt, model, Path(scratch))
        return model
    loaded = ckpt.latest(expected_model=model_fingerprint(model))
    if loaded is None:
        raise FileNotFoundError(f"job {spec.job_id!r} has no checkpoint in {store!r}")
    model.load_state_dict(loaded.state["model"])
    return model
