"""Does a fatal CUDA error in one tenant reach the other? Checked on a real NVIDIA GPU.

    python scripts/isolation_check.py                       # two existing MIG instances
    sudo python scripts/isolation_check.py --create 1g.10gb # create two, destroy them after
    python scripts/isolation_check.py --skip-mig --mps      # two MPS clients on one GPU
    python scripts/isolation_check.py --skip-mig --timeslice  # two plain processes, one GPU
    python scripts/isolation_check.py --skip-mig --mps --fault illegal-address  # an MMU fault

Each experiment starts two tenant processes (this file with ``--worker``), each running a
loop of small torch matmuls and writing its progress to a status file; once both make
progress, tenant A is told to raise a fatal CUDA error (``--fault``: ``assert``, an
out-of-bounds index on a CUDA tensor, a device-side assert in PyTorch's index kernel that
leaves A's CUDA context unusable; or ``illegal-address``, a Triton kernel's store 4 TiB past
its allocation, an MMU fault), and tenant B is watched for ``--observe-s`` seconds: it survived if it is still
running, reported no error and kept completing matmuls.

* MIG: A and B each pinned to one MIG instance (CUDA_VISIBLE_DEVICES=MIG-<uuid>), from
  ``nvidia-smi -L``, or created with ``--create PROFILE`` (``nvidia-smi mig -i GPU -cgi
  PROFILE,PROFILE -C``; needs root and MIG mode enabled) and destroyed at the end.
* MPS (``--mps``): an MPS control daemon of its own (pipe and log folders in a temporary
  folder, CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY), started with
  ``nvidia-cuda-mps-control -d``, stopped with "quit" on its stdin; A and B are its clients.
* time-slicing (``--timeslice``): A and B as plain processes on one device (one CUDA
  context each): the case DESIGN.md groups with "software sharing".

The device for MPS / time-slicing is ``--shared-device`` (a CUDA_VISIBLE_DEVICES value),
else the first GPU without MIG instances, else the first MIG instance.

Output: one JSON report on stdout, {"mig": {"a_failed": ..., "b_survived": ...}, "mps":
{...}, "timeslice": {...}}, for the experiments asked for. Exit status: 0 every experiment
asked for gave a result (whatever it was), 1 one could not be run (the reason is in its
section), 2 no NVIDIA GPU (no nvidia-smi, or it lists none). It changes nothing on the
device but the MIG instances it creates with ``--create`` (and destroys), and the MPS
daemon it starts (and stops). Commands are argv lists; no shell.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# What tenant A is made to do (--fault). An assert is a trap in A's own kernel; an illegal
# address is an MMU fault (XID 31), one of the "fatal GPU exceptions" NVIDIA's MPS docs say
# reach every client of the server.
FAULTS = {
    "assert": "out-of-bounds index on a CUDA tensor (device-side assert in the index kernel)",
    "illegal-address": "a store 4 TiB past a CUDA allocation from a Triton kernel (MMU fault)",
}
STATUS_EVERY_S = 0.1
PROFILE_RE = re.compile(r"^(\d+g\.\d+gb(\+me)?|\d+)$")  # a MIG GPU-instance profile: name or id
GPU_RE = re.compile(r"^GPU\s+(\d+):\s+(.*?)\s+\(UUID:\s*(GPU-[^)\s]+)\)")
MIG_RE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s*(MIG-[^)\s]+)\)")
CREATED_GI_RE = re.compile(r"created GPU instance ID\s+(\d+)\s+on GPU\s+(\d+)")


class CheckError(Exception):
    """An experiment cannot be run here; the message says why and what would fix it."""


class NoGpuError(CheckError):
    """No NVIDIA GPU to check (no driver tools, or none listed)."""


# -- nvidia-smi ---------------------------------------------------------------------------------


@dataclass
class Gpu:
    index: int
    name: str
    uuid: str
    migs: list[dict[str, Any]] = field(default_factory=list)  # {profile, device, uuid}


def parse_smi_list(text: str) -> list[Gpu]:
    """The GPUs and MIG devices of ``nvidia-smi -L`` output (MIG lines follow their GPU)."""
    gpus: list[Gpu] = []
    for line in text.splitlines():
        if m := GPU_RE.match(line):
            gpus.append(Gpu(int(m.group(1)), m.group(2), m.group(3)))
        elif (m := MIG_RE.match(line)) and gpus:
            gpus[-1].migs.append(
                {"profile": m.group(1), "device": int(m.group(2)), "uuid": m.group(3)}
            )
    return gpus


def parse_created_instances(text: str) -> list[tuple[int, int]]:
    """(gpu index, GPU-instance id) of each instance ``nvidia-smi mig -cgi`` created."""
    return [(int(m.group(2)), int(m.group(1))) for m in CREATED_GI_RE.finditer(text)]


def run_cmd(
    argv: list[str],
    timeout_s: float = 60.0,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """Run ``argv`` (no shell); its stdout, or CheckError with its output when it fails."""
    try:
        done = subprocess.run(  # noqa: S603 - argv lists built here, no shell
            argv,
            input=stdin,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except FileNotFoundError as e:
        raise CheckError(f"{argv[0]} not found") from e
    except subprocess.TimeoutExpired as e:
        raise CheckError(f"{' '.join(argv)} did not finish in {timeout_s:g} s") from e
    if done.returncode != 0:
        out = (done.stdout + done.stderr).strip()
        raise CheckError(f"{' '.join(argv)} failed (exit {done.returncode}): {out[-400:]}")
    return done.stdout


def list_gpus() -> list[Gpu]:
    if shutil.which("nvidia-smi") is None:
        raise NoGpuError("nvidia-smi not found: no NVIDIA driver on this machine")
    try:
        gpus = parse_smi_list(run_cmd(["nvidia-smi", "-L"]))
    except CheckError as e:
        raise NoGpuError(f"nvidia-smi cannot list GPUs: {e}") from e
    if not gpus:
        raise NoGpuError("nvidia-smi lists no GPU")
    return gpus


def mig_enabled(index: int) -> bool:
    out = run_cmd(
        ["nvidia-smi", "-i", str(index), "--query-gpu=mig.mode.current", "--format=csv,noheader"]
    )
    return out.strip().lower() == "enabled"


def create_instances(gpu: Gpu, profile: str) -> list[tuple[int, int]]:
    """Two GPU instances of ``profile`` (each with its default compute instance) on ``gpu``."""
    if not PROFILE_RE.match(profile):
        raise CheckError(
            f"--create {profile!r} is not a MIG GPU-instance profile (a name such as "
            "1g.10gb, or a profile id; `nvidia-smi mig -lgip` lists them)"
        )
    if os.geteuid() != 0:
        raise CheckError("--create needs root (nvidia-smi mig -cgi): run it with sudo")
    if not mig_enabled(gpu.index):
        raise CheckError(
            f"MIG mode is not enabled on GPU {gpu.index} ({gpu.name}): enable it with "
            f"`nvidia-smi -i {gpu.index} -mig 1` (root, GPU idle) or pick another with --gpu"
        )
    out = run_cmd(["nvidia-smi", "mig", "-i", str(gpu.index), "-cgi", f"{profile},{profile}", "-C"])
    created = parse_created_instances(out)
    if len(created) != 2:
        destroy_instances(created)
        raise CheckError(f"expected two GPU instances from nvidia-smi mig -cgi, got: {out[-400:]}")
    return created


def destroy_instances(created: list[tuple[int, int]]) -> list[str]:
    """Destroy what create_instances made (compute instances first); errors, if any."""
    errors = []
    for gpu, gi in created:
        for flag in ("-dci", "-dgi"):
            try:
                run_cmd(["nvidia-smi", "mig", "-i", str(gpu), "-gi", str(gi), flag])
            except CheckError as e:
                errors.append(str(e))
    return errors


def pick_gpu(gpus: list[Gpu], index: int | None) -> Gpu:
    if index is None:
        return next((g for g in gpus if g.migs), gpus[0])
    for g in gpus:
        if g.index == index:
            return g
    raise CheckError(f"--gpu {index}: no such GPU (listed: {[g.index for g in gpus]})")


def shared_device(gpus: list[Gpu], override: str | None) -> str:
    """The CUDA_VISIBLE_DEVICES value for the MPS and time-slicing experiments."""
    if override:
        return override
    plain = next((g for g in gpus if not g.migs), None)
    if plain is not None:
        return plain.uuid
    return gpus[0].migs[0]["uuid"]  # every GPU is in MIG mode: share one instance


# -- the tenants --------------------------------------------------------------------------------


def write_status(path: Path, **status: Any) -> None:
    """Atomically replace the tenant's status file (the parent never reads half of one)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(status))
    os.replace(tmp, path)


def read_status(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {"steps": 0, "state": "starting"}


def trigger_fault(torch: Any, device: Any, kind: str = "assert") -> None:
    """``assert``: index a tensor far out of bounds: on CUDA a device-side assert (raised at
    the synchronize), on the CPU an IndexError at once. ``illegal-address``: a store far
    past a CUDA allocation (CUDA only)."""
    if kind == "illegal-address":
        _store_out_of_bounds(torch, device)
        return
    x = torch.arange(16, device=device, dtype=torch.float32)
    idx = torch.tensor([1 << 20], device=device)
    y = x[idx]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    float(y.sum())


def _store_out_of_bounds(torch: Any, device: Any) -> None:
    if device.type != "cuda":
        raise RuntimeError("an illegal-address fault needs a CUDA device")
    import triton  # PyTorch's CUDA builds bring it
    import triton.language as tl

    @triton.jit
    def store_far(ptr):
        tl.store(ptr + (1 << 40), 1.0)  # 4 TiB past the allocation: unmapped

    x = torch.zeros(1, device=device)
    store_far[(1,)](x)
    torch.cuda.synchronize(device)


def tenant(folder: Path, name: str, device_name: str, size: int, max_s: float) -> int:
    """A tenant's loop: matmuls until ``stop`` appears; raises the fault when ``fault-<name>``
    appears (the fault named in it). Status in ``<name>.json``: steps, state (running | fault
    | error | stopped)."""
    import torch

    status, started = folder / f"{name}.json", time.monotonic()
    steps, last = 0, 0.0
    try:
        device = torch.device(device_name)
        a = torch.randn(size, size, device=device)
        b = torch.randn(size, size, device=device)
        while time.monotonic() - started < max_s:
            if (folder / "stop").exists():
                write_status(status, steps=steps, state="stopped")
                return 0
            if (trigger := folder / f"fault-{name}").exists():
                return _fault(torch, device, status, steps, trigger.read_text() or "assert")
            c = a @ b
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # an error from elsewhere surfaces here
            a = c / c.norm()
            steps += 1
            if time.monotonic() - last >= STATUS_EVERY_S:
                write_status(status, steps=steps, state="running", t=time.time())
                last = time.monotonic()
        write_status(status, steps=steps, state="stopped", note="max time reached")
        return 0
    except Exception as e:  # noqa: BLE001 - any error of this tenant is the observation
        write_status(status, steps=steps, state="error", error=f"{type(e).__name__}: {e}"[:500])
        return 4


def _fault(torch: Any, device: Any, status: Path, steps: int, kind: str) -> int:
    try:
        trigger_fault(torch, device, kind)
    except Exception as e:  # noqa: BLE001 - the fault we asked for
        error = f"{type(e).__name__}: {e}"[:500]
    else:
        write_status(status, steps=steps, state="error", error="the fault raised nothing")
        return 5
    # Is the context poisoned? One more matmul, synchronized.
    try:
        z = torch.ones(4, 4, device=device) @ torch.ones(4, 4, device=device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        float(z.sum())
        poisoned, after = False, ""
    except Exception as e:  # noqa: BLE001
        poisoned, after = True, f"{type(e).__name__}: {e}"[:300]
    write_status(
        status, steps=steps, state="fault", error=error, context_poisoned=poisoned, after=after
    )
    return 3


# -- one experiment: two tenants, a fault in A ------------------------------------------------------


@dataclass
class Timing:
    start_timeout_s: float = 120.0
    warmup_s: float = 3.0
    fault_timeout_s: float = 60.0
    observe_s: float = 5.0
    min_steps: int = 3  # B must complete at least this many matmuls after A's fault


def _spawn(folder: Path, name: str, env: dict[str, str], device: str, size: int, max_s: float):
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", name]
    argv += ["--dir", str(folder), "--device", device, "--size", str(size), "--max-s", str(max_s)]
    log = open(folder / f"{name}.log", "w")  # noqa: SIM115 - closed when the pair ends
    proc = subprocess.Popen(  # noqa: S603 - this script itself, argv list, no shell
        argv, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    return proc, log


def _wait(cond: Any, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def run_pair(
    env_a: dict[str, str],
    env_b: dict[str, str],
    timing: Timing | None = None,
    device: str = "cuda",
    size: int = 256,
    fault: str = "assert",
) -> dict[str, Any]:
    """Start tenants A and B, make A raise ``fault`` once both run, watch B; the
    observation as a dict."""
    t = timing or Timing()
    max_s = t.start_timeout_s + t.warmup_s + t.fault_timeout_s + t.observe_s + 30.0
    with tempfile.TemporaryDirectory(prefix="isolation-") as tmp:
        folder = Path(tmp)
        procs = {
            n: _spawn(folder, n, e, device, size, max_s) for n, e in (("a", env_a), ("b", env_b))
        }
        try:
            return _observe(folder, procs, t, fault)
        finally:
            (folder / "stop").touch()
            for proc, log in procs.values():
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()  # our own child, by its handle
                    proc.wait()
                log.close()


def _observe(folder: Path, procs: dict[str, Any], t: Timing, fault: str) -> dict[str, Any]:
    def status(n: str) -> dict[str, Any]:
        return read_status(folder / f"{n}.json")

    def log_tail(n: str) -> str:
        procs[n][1].flush()
        return (folder / f"{n}.log").read_text(errors="replace")[-600:]

    started = _wait(
        lambda: all(status(n)["steps"] > 0 or procs[n][0].poll() is not None for n in procs),
        t.start_timeout_s,
    )
    if not started or any(status(n)["steps"] == 0 for n in procs):
        raise CheckError(
            "the tenants did not start: "
            + "; ".join(f"{n}: {status(n)} {log_tail(n)!r}" for n in procs)
        )
    time.sleep(t.warmup_s)
    (folder / "fault-a").write_text(fault)
    faulted = _wait(
        lambda: status("a")["state"] in ("fault", "error") or procs["a"][0].poll() is not None,
        t.fault_timeout_s,
    )
    b_at_fault = status("b")["steps"]
    time.sleep(t.observe_s)
    a, b = status("a"), status("b")
    b_alive = procs["b"][0].poll() is None
    b_steps = b["steps"] - b_at_fault
    return {
        "a_failed": faulted and a["state"] in ("fault", "error"),
        "a_error": a.get("error", ""),
        "a_context_poisoned": a.get("context_poisoned"),
        "b_survived": b_alive and b["state"] == "running" and b_steps >= t.min_steps,
        "b_alive": b_alive,
        "b_state": b["state"],
        "b_error": b.get("error", ""),
        "b_steps_before_fault": b_at_fault,
        "b_steps_after_fault": b_steps,
        "observed_s": t.observe_s,
        "a_log_tail": "" if a["state"] == "fault" else log_tail("a"),
    }


# -- the experiments ----------------------------------------------------------------------------


def check_mig(
    gpus: list[Gpu], gpu_index: int | None, create: str | None, t: Timing, fault: str
) -> dict:
    if create and gpu_index is None:  # the first GPU in MIG mode: where instances can go
        gpu_index = next((g.index for g in gpus if mig_enabled(g.index)), gpus[0].index)
    gpu = pick_gpu(gpus, gpu_index)
    created: list[tuple[int, int]] = []
    try:
        if create:
            before = {m["uuid"] for m in gpu.migs}
            created = create_instances(gpu, create)
            gpu = pick_gpu(list_gpus(), gpu.index)
            migs = [m for m in gpu.migs if m["uuid"] not in before]
        else:
            migs = gpu.migs
        if len(migs) < 2:
            raise CheckError(
                f"GPU {gpu.index} ({gpu.name}) has {len(migs)} MIG device(s), two are needed: "
                "create them (--create 1g.10gb, as root, MIG mode enabled), pick another GPU "
                "with --gpu, or pass --skip-mig"
            )
        a, b = migs[0], migs[1]
        result = run_pair(_env(a["uuid"]), _env(b["uuid"]), t, fault=fault)
        result["instances"] = [f"{m['profile']} {m['uuid']}" for m in (a, b)]
        result["gpu"] = f"{gpu.index}: {gpu.name}"
        return result
    finally:
        if created and (errors := destroy_instances(created)):
            print(f"could not destroy the MIG instances it created: {errors}", file=sys.stderr)


def check_timeslice(device: str, t: Timing, fault: str) -> dict:
    result = run_pair(_env(device), _env(device), t, fault=fault)
    result["device"] = device
    return result


def check_mps(device: str, t: Timing, fault: str) -> dict:
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        raise CheckError("nvidia-cuda-mps-control not found: MPS is not installed here")
    with tempfile.TemporaryDirectory(prefix="isolation-mps-") as tmp:
        pipes, logs = Path(tmp, "pipe"), Path(tmp, "log")
        pipes.mkdir()
        logs.mkdir()
        env = _env(device)
        env.update(CUDA_MPS_PIPE_DIRECTORY=str(pipes), CUDA_MPS_LOG_DIRECTORY=str(logs))
        run_cmd([control, "-d"], env=env)  # the daemon forks; the server starts with a client
        try:
            result = run_pair(env, env, t, fault=fault)
        finally:
            try:
                run_cmd([control], stdin="quit\n", env=env)
                stop_error = ""
            except CheckError as e:
                stop_error = str(e)
        control_log = logs / "control.log"
        result["mps_control_log_tail"] = (
            control_log.read_text(errors="replace")[-800:] if control_log.exists() else ""
        )
        result["device"] = device
        if stop_error:
            result["mps_stop_error"] = stop_error
        return result


def _env(visible: str) -> dict[str, str]:
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = visible
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--create", metavar="PROFILE", help="create two MIG instances of PROFILE")
    p.add_argument(
        "--gpu", type=int, help="GPU index for MIG (default: the first with MIG devices)"
    )
    p.add_argument("--skip-mig", action="store_true", help="no MIG experiment")
    p.add_argument("--mps", action="store_true", help="also two MPS clients on one device")
    p.add_argument(
        "--timeslice", action="store_true", help="also two plain processes on one device"
    )
    p.add_argument("--shared-device", help="CUDA_VISIBLE_DEVICES for --mps / --timeslice")
    p.add_argument(
        "--fault",
        choices=sorted(FAULTS),
        default="assert",
        help="what tenant A is made to do (default: assert)",
    )
    p.add_argument("--warmup-s", type=float, default=3.0)
    p.add_argument("--observe-s", type=float, default=5.0)
    p.add_argument("--start-timeout-s", type=float, default=120.0)
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run one tenant
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, default=256, help=argparse.SUPPRESS)
    p.add_argument("--max-s", type=float, default=600.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("warmup_s", "observe_s", "start_timeout_s"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.skip_mig and not (args.mps or args.timeslice):
        p.error("--skip-mig leaves nothing to check: add --mps and/or --timeslice")
    if args.create and args.skip_mig:
        p.error("--create makes MIG instances for the MIG experiment; drop --skip-mig")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return tenant(Path(args.dir), args.worker, args.device, args.size, args.max_s)
    timing = Timing(
        start_timeout_s=args.start_timeout_s, warmup_s=args.warmup_s, observe_s=args.observe_s
    )
    report: dict[str, Any] = {"fault": FAULTS[args.fault]}
    try:
        gpus = list_gpus()
    except NoGpuError as e:
        report["error"] = str(e)
        print(json.dumps(report, indent=2))
        print(f"isolation_check: {e}", file=sys.stderr)
        return 2
    report["gpus"] = [
        {"index": g.index, "name": g.name, "mig_devices": [m["profile"] for m in g.migs]}
        for g in gpus
    ]
    experiments: dict[str, Any] = {}
    if not args.skip_mig:
        experiments["mig"] = lambda: check_mig(gpus, args.gpu, args.create, timing, args.fault)
    device = shared_device(gpus, args.shared_device)
    if args.mps:
        experiments["mps"] = lambda: check_mps(device, timing, args.fault)
    if args.timeslice:
        experiments["timeslice"] = lambda: check_timeslice(device, timing, args.fault)
    ok = True
    for name, run in experiments.items():
        try:
            report[name] = run()
        except CheckError as e:
            report[name] = {"error": str(e)}
            print(f"isolation_check: {name}: {e}", file=sys.stderr)
            ok = False
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
