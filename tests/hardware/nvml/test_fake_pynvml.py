"""The NVML fake (tests/hardware/nvml/fake_pynvml/) is only useful if it matches nvidia-ml-py."""

from __future__ import annotations

import ctypes
import inspect

import pynvml
import pytest

from tests.hardware.nvml import fake_pynvml
from tests.hardware.nvml.helpers import FakeNvml, backend_nvml_calls, mig_on


def test_fake_functions_have_pynvml_signatures():
    names = fake_pynvml.api_names()
    assert len(names) > 50
    for name in names:
        real = inspect.signature(getattr(pynvml, name))
        fake = inspect.signature(getattr(FakeNvml, name))
        fake_params = list(fake.parameters.values())[1:]  # drop self
        assert [p.name for p in fake_params] == list(real.parameters), name
        assert [p.default for p in fake_params] == [p.default for p in real.parameters.values()], (
            name
        )


def test_fake_constants_and_structs_are_pynvml_s():
    f = FakeNvml()
    assert f.NVML_ERROR_GPU_IS_LOST == pynvml.NVML_ERROR_GPU_IS_LOST
    assert f.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
    assert f.c_nvmlGpuInstancePlacement_t is pynvml.c_nvmlGpuInstancePlacement_t
    with pytest.raises(AttributeError):
        f.nvmlNoSuchFunction  # noqa: B018


def test_fake_refuses_calls_before_init():
    f = FakeNvml()
    with pytest.raises(fake_pynvml.NVMLError) as e:
        f.nvmlDeviceGetCount()
    assert e.value.value == pynvml.NVML_ERROR_UNINITIALIZED


def test_fake_enforces_ci_before_gi_destroy_order():
    f = FakeNvml(["a100-40gb"])
    mig_on(f, 0)
    f.nvmlInit()
    h = f.nvmlDeviceGetHandleByIndex(0)
    gi = f.nvmlDeviceCreateGpuInstance(h, 9)  # 3g.20gb by id
    f.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    with pytest.raises(fake_pynvml.NVMLError) as e:
        f.nvmlGpuInstanceDestroy(gi)
    assert e.value.value == pynvml.NVML_ERROR_IN_USE


def test_fake_enum_is_not_an_id():
    f = FakeNvml(["a100-40gb"])
    mig_on(f, 0)
    f.nvmlInit()
    h = f.nvmlDeviceGetHandleByIndex(0)
    info = f.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1)
    assert info.id == 20 and pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 == 7
    count = ctypes.c_uint(0)
    with pytest.raises(fake_pynvml.NVMLError) as e:  # 7 is the enum, no profile has id 7
        f.nvmlDeviceGetGpuInstancePossiblePlacements(h, 7, None, ctypes.byref(count))
    assert e.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT
    # enum 0 (1_SLICE) read as an id is the 7g profile: one placement of 8 memory slices
    f.nvmlDeviceGetGpuInstancePossiblePlacements(h, 0, None, ctypes.byref(count))
    arr = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    f.nvmlDeviceGetGpuInstancePossiblePlacements(h, 0, arr, ctypes.byref(count))
    assert [(p.start, p.size) for p in arr] == [(0, 8)]


def test_fake_remaining_capacity_tracks_overlap():
    f = FakeNvml(["a100-40gb"])
    mig_on(f, 0)
    f.nvmlInit()
    h = f.nvmlDeviceGetHandleByIndex(0)
    assert f.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 9) == 2  # 3g.20gb at 0 and 4
    pl = pynvml.c_nvmlGpuInstancePlacement_t(4, 4)
    f.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, ctypes.byref(pl))
    assert f.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 9) == 1
    assert f.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 0) == 0  # 7g needs every slice
    with pytest.raises(fake_pynvml.NVMLError) as e:
        f.nvmlDeviceCreateGpuInstanceWithPlacement(
            h, 14, ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(4, 2))
        )
    assert e.value.value == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    with pytest.raises(fake_pynvml.NVMLError) as e:  # a struct by value, not a pointer
        f.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, pynvml.c_nvmlGpuInstancePlacement_t(0, 4))
    assert e.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_every_backend_call_is_a_pynvml_function_the_fake_has():
    """Collected from the source, so a new call is checked without editing this test."""
    sites = backend_nvml_calls()
    names = {s.name for s in sites}
    assert len(names) > 40 and "nvmlDeviceGetGpuInstancePossiblePlacements" in names
    implemented = set(fake_pynvml.api_names())
    for site in sites:
        real = getattr(pynvml, site.name, None)
        assert inspect.isfunction(real), f"{site.where}: pynvml has no function {site.name}"
        assert site.name in implemented, f"{site.where}: the fake does not implement {site.name}"
        real_sig = inspect.signature(real)
        fake_sig = inspect.signature(getattr(FakeNvml, site.name))
        fake_params = list(fake_sig.parameters.values())[1:]  # drop self
        assert _positional_count(fake_params) == _positional_count(real_sig.parameters.values()), (
            f"{site.name}: the fake takes {fake_sig}, pynvml {real_sig}"
        )
        try:
            real_sig.bind(*range(site.positional), **dict.fromkeys(site.keywords))
        except TypeError as e:
            pytest.fail(f"{site.where}: {site.name}{real_sig} cannot take this call: {e}")


def _positional_count(params) -> int:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds)
