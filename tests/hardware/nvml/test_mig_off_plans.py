"""Plans from MIG mode off through the NVML backend: profiles from NVML, not the tables.

NVIDIA's config-default.yaml (mig-parted) applies ``all-balanced`` to every board added to
hardware/skus.py, and a card no table knows takes an explicit plan, all starting with MIG
off, after which ``assert_plan`` finds nothing to report.
"""

from __future__ import annotations

import pytest
from gpuflow.hardware.partition import apply_plan, assert_plan, load_plan
from gpuflow.hardware.skus import SKUS

from tests.hardware.nvml.helpers import NODE, FakeNvml, backend
from tests.hardware.partition.helpers import PLANS

CONFIG_DEFAULT = PLANS / "mig-parted" / "config-default.yaml"
NEW_BOARDS = (
    "a800-80gb",
    "a100-pcie-40gb",
    "a100-pcie-80gb",
    "h800",
    "h100-pcie",
    "h100-nvl",
    "h20",
    "gh200",
    "gh200-144gb",
    "a30",
)
FUTURE_PLAN = """
version: v1
mig-configs:
  future-mixed:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.32gb": 2
        "2g.64gb": 1
"""


def _table_calls(fake: FakeNvml) -> list[str]:
    return [c for c in fake.calls if c == "nvmlDeviceGetGpuInstanceProfileInfo"]


@pytest.mark.parametrize("board", NEW_BOARDS)
def test_all_balanced_applies_from_mig_off_and_asserts(board: str) -> None:
    fake = FakeNvml([board])
    b = backend(fake)
    assert b.mig_mode(NODE, 0) == (False, False)
    plan = load_plan(CONFIG_DEFAULT)
    report = apply_plan(b, plan, "all-balanced")
    [change] = report.devices
    assert change.changed and change.after.mig_enabled
    assert b.mig_mode(NODE, 0) == (True, True)
    assert assert_plan(b, plan, "all-balanced") == []
    want = next(e.mig_devices for e in plan.configs["all-balanced"] if _selects(e, fake))
    got: dict[str, int] = {}
    for p in b.partitions(NODE, 0):
        got[p.profile] = got.get(p.profile, 0) + 1
    assert got == want


def _selects(entry, fake: FakeNvml) -> bool:
    pci = fake.device(0).spec.pci_device_id
    return any(f.upper() == pci.upper() for f in entry.device_filter or ())


def test_a800_plans_from_nvml_not_from_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The A800 is planned from NVML's MIG-off answers even with its table row gone."""
    fake = FakeNvml(["a800-80gb"])
    b = backend(fake)
    monkeypatch.delitem(SKUS, "NVIDIA A800-SXM4-80GB")
    plan = load_plan(CONFIG_DEFAULT)
    apply_plan(b, plan, "all-balanced")
    # NVML's v1 profile info was read before MIG mode was switched on
    first_set = fake.calls.index("nvmlDeviceSetMigMode")
    assert "nvmlDeviceGetGpuInstanceProfileInfo" in fake.calls[:first_set]
    assert assert_plan(b, plan, "all-balanced") == []
    assert sorted(p.profile for p in b.partitions(NODE, 0)) == [
        "1g.10gb",
        "1g.10gb",
        "2g.20gb",
        "3g.40gb",
    ]


def test_a_card_in_no_table_is_partitioned_from_mig_off() -> None:
    fake = FakeNvml(["future-gpu", "v100"])
    b = backend(fake)
    name = fake.device(0).spec.name
    pci = fake.device(0).spec.pci_device_id
    assert name not in SKUS and all(s.pci_device_id != pci for s in SKUS.values())
    assert pci.lower() not in CONFIG_DEFAULT.read_text().lower()
    profiles = b.partition_profiles(NODE, 0)
    assert [(p.name, p.profile_id) for p in profiles] == [
        ("1g.32gb", 30),
        ("1g.32gb+me", 31),
        ("2g.64gb", 32),
        ("4g.128gb", 33),
    ]
    plan = load_plan(FUTURE_PLAN)
    report = apply_plan(b, plan)
    assert [d.index for d in report.devices] == [0]  # the V100 is skipped (no MIG)
    assert assert_plan(b, plan) == []
    assert sorted(p.profile for p in b.partitions(NODE, 0)) == ["1g.32gb", "1g.32gb", "2g.64gb"]
    gis = fake.device(0).gpu_instances.values()
    assert sorted(g.profile.id for g in gis) == [30, 30, 32]
    assert sum(g.profile.compute_slices for g in gis) == 4  # all of its 4 compute slices


def test_a_card_in_no_table_on_a_driver_without_mig_off_profiles_has_none() -> None:
    """An R535-like driver answers no profile with MIG off: no table, so nothing to plan."""
    fake = FakeNvml(["future-gpu"], profiles_with_mig_off=False)
    b = backend(fake)
    assert b.partition_profiles(NODE, 0) == []
    assert _table_calls(fake)  # NVML was asked first
    plan = load_plan(FUTURE_PLAN)
    report = apply_plan(b, plan)
    assert report.devices == ()  # "devices: all" skips a device with no profiles
    assert fake.device(0).gpu_instances == {}
