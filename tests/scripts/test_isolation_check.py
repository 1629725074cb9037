"""scripts/isolation_check.py without a GPU: nvidia-smi parsing, the no-GPU and no-MIG
errors, the create/destroy bookkeeping on a faked nvidia-smi, and the two tenants with the
fault in A run for real on the CPU (the orchestration is the same as on CUDA)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "isolation_check.py"

A100_MIG = """\
GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
  MIG 1g.10gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)
  MIG 1g.10gb     Device  1: (UUID: MIG-0e8e6a4c-8b7a-5d26-9a0b-7f1f0f3f2a11)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-11111111-2222-3333-4444-555555555555)
"""
OLD_DRIVER = """\
GPU 0: A100-SXM4-40GB (UUID: GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee)
  MIG 3g.20gb Device 0: (UUID: MIG-GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee/1/0)
"""
NO_MIG = "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)\n"
CREATED = """\
Successfully created GPU instance ID  1 on GPU  0 using profile MIG 1g.10gb (ID 19)
Successfully created compute instance ID  0 on GPU  0 GPU instance ID  1 using profile MIG 1g.10gb (ID  0)
Successfully created GPU instance ID  2 on GPU  0 using profile MIG 1g.10gb (ID 19)
Successfully created compute instance ID  0 on GPU  0 GPU instance ID  2 using profile MIG 1g.10gb (ID  0)
"""


@pytest.fixture
def mod(monkeypatch):
    name = "isolation_check_under_test"
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_nvidia_smi_listing_is_parsed_with_its_mig_devices(mod):
    gpus = mod.parse_smi_list(A100_MIG)
    assert [(g.index, g.name) for g in gpus] == [
        (0, "NVIDIA A100-SXM4-80GB"),
        (1, "NVIDIA H100 80GB HBM3"),
    ]
    assert [m["profile"] for m in gpus[0].migs] == ["1g.10gb", "1g.10gb"]
    assert gpus[0].migs[1]["uuid"] == "MIG-0e8e6a4c-8b7a-5d26-9a0b-7f1f0f3f2a11"
    assert gpus[1].migs == []
    old = mod.parse_smi_list(OLD_DRIVER)
    assert old[0].migs[0]["uuid"] == "MIG-GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee/1/0"
    assert mod.parse_smi_list("No devices were found\n") == []
    # MPS / time-slicing go to a GPU without MIG instances when there is one
    assert mod.shared_device(gpus, None) == gpus[1].uuid
    assert mod.shared_device(old, None) == old[0].migs[0]["uuid"]


def test_created_instances_are_read_from_nvidia_smi_mig(mod):
    assert mod.parse_created_instances(CREATED) == [(0, 1), (0, 2)]


def _main_json(mod, capsys, argv):
    code = mod.main(argv)
    return code, json.loads(capsys.readouterr().out)


def test_no_gpu_is_a_clear_error(mod, monkeypatch, capsys):
    monkeypatch.setattr(mod.shutil, "which", lambda _name: None)
    code, out = _main_json(mod, capsys, [])
    assert code == 2
    assert "nvidia-smi not found" in out["error"]
    monkeypatch.setattr(mod.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(mod, "run_cmd", lambda argv, **_: "No devices were found\n")
    code, out = _main_json(mod, capsys, [])
    assert code == 2 and "lists no GPU" in out["error"]


def test_too_few_mig_devices_says_how_to_get_them(mod, monkeypatch, capsys):
    monkeypatch.setattr(mod.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(mod, "run_cmd", lambda argv, **_: NO_MIG)
    code, out = _main_json(mod, capsys, [])
    assert code == 1
    assert "--create" in out["mig"]["error"] and "0 MIG device" in out["mig"]["error"]


def test_create_needs_root_and_a_real_profile(mod, monkeypatch, capsys):
    monkeypatch.setattr(mod.shutil, "which", lambda name: f"/usr/bin/{name}")
    calls = []

    def fake(argv, **_):
        calls.append(argv)
        return "Enabled\n" if "--query-gpu=mig.mode.current" in argv else NO_MIG

    monkeypatch.setattr(mod, "run_cmd", fake)
    monkeypatch.setattr(mod.os, "geteuid", lambda: 1000)
    code, out = _main_json(mod, capsys, ["--create", "1g.10gb"])
    assert code == 1 and "root" in out["mig"]["error"]
    code, out = _main_json(mod, capsys, ["--create", "1g.10gb;reboot"])
    assert code == 1 and "not a MIG GPU-instance profile" in out["mig"]["error"]
    assert not any("-cgi" in c for c in calls)  # nothing was created


def test_created_instances_are_used_and_destroyed(mod, monkeypatch, capsys):
    monkeypatch.setattr(mod.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(mod.os, "geteuid", lambda: 0)
    existing = "  MIG 3g.40gb     Device  0: (UUID: MIG-00000000-0000-0000-0000-000000000000)\n"
    state = {"created": False}
    calls = []

    def fake(argv, **_):
        calls.append(argv)
        if "--query-gpu=mig.mode.current" in argv:
            return "Enabled\n"
        if "-cgi" in argv:
            state["created"] = True
            return CREATED
        if argv[:2] == ["nvidia-smi", "-L"]:
            new = A100_MIG.splitlines()[1:3] if state["created"] else []
            return NO_MIG + existing + "".join(line + "\n" for line in new)
        return ""

    pairs = []
    monkeypatch.setattr(
        mod,
        "run_pair",
        lambda a, b, t, fault: (
            pairs.append((a, b, fault)) or {"a_failed": True, "b_survived": True}
        ),
    )
    monkeypatch.setattr(mod, "run_cmd", fake)
    code, out = _main_json(mod, capsys, ["--create", "1g.10gb", "--fault", "illegal-address"])
    assert code == 0 and out["mig"]["b_survived"] is True
    assert out["fault"] == mod.FAULTS["illegal-address"]
    ((env_a, env_b, fault),) = pairs
    assert fault == "illegal-address"
    assert env_a["CUDA_VISIBLE_DEVICES"] == "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"
    assert env_b["CUDA_VISIBLE_DEVICES"] == "MIG-0e8e6a4c-8b7a-5d26-9a0b-7f1f0f3f2a11"
    assert ["nvidia-smi", "mig", "-i", "0", "-cgi", "1g.10gb,1g.10gb", "-C"] in calls
    destroyed = [c for c in calls if "-dci" in c or "-dgi" in c]
    assert destroyed == [
        ["nvidia-smi", "mig", "-i", "0", "-gi", "1", "-dci"],
        ["nvidia-smi", "mig", "-i", "0", "-gi", "1", "-dgi"],
        ["nvidia-smi", "mig", "-i", "0", "-gi", "2", "-dci"],
        ["nvidia-smi", "mig", "-i", "0", "-gi", "2", "-dgi"],
    ]


def test_bad_arguments_are_refused(mod):
    for argv in (["--skip-mig"], ["--observe-s", "-1"], ["--create", "1g.10gb", "--skip-mig"]):
        with pytest.raises(SystemExit):
            mod.parse_args(argv)


def test_a_tenant_reports_its_fault_and_stops_when_told(mod, tmp_path):
    (tmp_path / "fault-a").touch()
    assert mod.tenant(tmp_path, "a", "cpu", 8, max_s=30) == 3
    a = mod.read_status(tmp_path / "a.json")
    assert a["state"] == "fault" and "IndexError" in a["error"]
    assert a["context_poisoned"] is False  # the CPU has no context to poison
    (tmp_path / "stop").touch()
    assert mod.tenant(tmp_path, "b", "cpu", 8, max_s=30) == 0
    assert mod.read_status(tmp_path / "b.json")["state"] == "stopped"


def test_the_fault_named_in_the_trigger_is_the_one_raised(mod, tmp_path):
    """The driver writes --fault into A's trigger; an MMU fault needs CUDA, which the CPU
    tenant says instead of raising another fault in its place."""
    (tmp_path / "fault-a").write_text("illegal-address")
    assert mod.tenant(tmp_path, "a", "cpu", 8, max_s=30) == 3
    a = mod.read_status(tmp_path / "a.json")
    assert a["state"] == "fault" and "needs a CUDA device" in a["error"]
    assert mod.parse_args(["--skip-mig", "--mps", "--fault", "illegal-address"]).fault == (
        "illegal-address"
    )
    with pytest.raises(SystemExit):
        mod.parse_args(["--skip-mig", "--mps", "--fault", "segfault"])


def test_two_tenants_on_the_cpu_one_faults_the_other_carries_on(mod, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two tenants on a shared 2-core machine
    timing = mod.Timing(start_timeout_s=90, warmup_s=0.2, fault_timeout_s=30, observe_s=1.0)
    env = dict(mod.os.environ)
    out = mod.run_pair(env, env, timing, device="cpu", size=32)
    assert out["a_failed"] is True and "IndexError" in out["a_error"]
    assert out["b_survived"] is True and out["b_steps_after_fault"] >= timing.min_steps
    assert out["b_error"] == ""
