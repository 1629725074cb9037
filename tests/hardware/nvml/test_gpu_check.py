"""scripts/gpu_check.py on the NVML fake."""

from __future__ import annotations

from gpuflow.hardware.nvml import NvmlBackend

from tests.hardware.nvml.helpers import NODE, FakeNvml, R, backend, mig_on


def _load_gpu_check():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "scripts" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_check_reads_everything_and_changes_nothing(monkeypatch, capsys):
    import json

    mod = _load_gpu_check()
    fake = FakeNvml(["a100-40gb", "v100"])
    mig_on(fake, 0)

    class OnFake(NvmlBackend):
        def __init__(self):
            super().__init__(node_name=NODE, nvml=fake)

        @classmethod
        def available(cls, nvml=None):
            return NvmlBackend.available(nvml=fake)

    # a partition that exists before the check runs
    backend(fake).create_partitions(NODE, 0, [R("3g.20gb")])
    fake.calls.clear()
    monkeypatch.setattr(mod, "NvmlBackend", OnFake)
    assert mod.main(["--json", "--sleep-s", "0"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ok"] and summary["driver_version"] == fake.driver_version
    a100, v100 = summary["devices"]
    assert a100["mig_profiles_source"] == "nvml"
    assert [p["profile"] for p in a100["partitions"]] == ["3g.20gb"]
    assert a100["energy"]["delta_mj"] == 0 and v100["mig_mode"] is None
    changing = (
        "nvmlDeviceSet",
        "nvmlDeviceReset",
        "nvmlDeviceCreate",
        "nvmlGpuInstanceCreate",
        "nvmlGpuInstanceDestroy",
        "nvmlComputeInstanceDestroy",
    )
    assert not [c for c in fake.calls if c.startswith(changing)]
    assert "nvmlDeviceGetGpuInstancePossiblePlacements" in fake.calls


def test_gpu_check_without_nvml_exits_nonzero(monkeypatch, capsys):
    mod = _load_gpu_check()
    monkeypatch.setattr(
        mod.NvmlBackend, "available", classmethod(lambda cls, nvml=None: (False, "no driver here"))
    )
    assert mod.main(["--json"]) == 2
    captured = capsys.readouterr()
    assert '"available": false' in captured.out and "no driver here" in captured.err
