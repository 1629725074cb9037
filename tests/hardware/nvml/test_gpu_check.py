"""scripts/gpu_check.py on the NVML fake (and what every GPU script does without NVML)."""

from __future__ import annotations

import pytest

from tests.hardware.nvml.helpers import (
    NODE,
    FakeNvml,
    R,
    backend,
    backend_class_on,
    load_script,
    mig_on,
)


def _load_gpu_check():
    return load_script("gpu_check")


def test_gpu_check_reads_everything_and_changes_nothing(monkeypatch, capsys):
    import json

    mod = _load_gpu_check()
    fake = FakeNvml(["a100-40gb", "v100"])
    mig_on(fake, 0)

    # a partition that exists before the check runs
    backend(fake).create_partitions(NODE, 0, [R("3g.20gb")])
    fake.calls.clear()
    monkeypatch.setattr(mod, "NvmlBackend", backend_class_on(fake))
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


@pytest.mark.parametrize("script", ["gpu_check", "gpu_train_check"])
def test_a_gpu_script_without_nvml_exits_2_with_the_reason(script, monkeypatch, capsys):
    mod = load_script(script)
    monkeypatch.setattr(
        mod.NvmlBackend, "available", classmethod(lambda cls, nvml=None: (False, "no driver here"))
    )
    assert mod.main(["--json"]) == 2
    captured = capsys.readouterr()
    assert '"available": false' in captured.out and "no driver here" in captured.err
