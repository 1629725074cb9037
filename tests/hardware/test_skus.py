"""The SKU tables (hardware/skus.py): MIG geometry per board, names, ids and estimates."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from gpuflow.hardware.backend import PartitionRequest
from gpuflow.hardware.nvml import mig_profile_name
from gpuflow.hardware.partition import load_plan
from gpuflow.hardware.placement import fit_mig
from gpuflow.hardware.skus import (
    A30_MIG_GEOMETRY,
    A100_MIG_GEOMETRY,
    SKU_ALIASES,
    SKUS,
    sku,
)

CONFIG_DEFAULT = Path(__file__).parent / "plans" / "mig-parted" / "config-default.yaml"
MIG_SKUS = sorted(n for n, s in SKUS.items() if s.supports_mig)
_FIELDS = {f.name for f in dataclasses.fields(SKUS["NVIDIA A30"])}


def test_existing_profiles_are_unchanged():
    """The twin and the partition tests rely on these exact rows."""
    a100 = sku("a100-40gb").mig_profiles
    assert [(p.name, p.profile_id, p.compute_slices, p.memory_mb, p.max_count) for p in a100] == [
        ("1g.5gb", 19, 1, 4864, 7),
        ("1g.5gb+me", 20, 1, 4864, 1),
        ("1g.10gb", 15, 1, 9984, 4),
        ("2g.10gb", 14, 2, 9984, 3),
        ("3g.20gb", 9, 3, 20096, 2),
        ("4g.20gb", 5, 4, 20096, 1),
        ("7g.40gb", 0, 7, 40448, 1),
    ]
    assert [(p.placement_starts, p.placement_size) for p in a100] == [
        ((0, 1, 2, 3, 4, 5, 6), 1),
        ((0, 1, 2, 3, 4, 5, 6), 1),
        ((0, 2, 4, 6), 2),
        ((0, 2, 4), 2),
        ((0, 4), 4),
        ((0,), 4),
        ((0,), 8),
    ]
    assert [p.name for p in sku("h200").mig_profiles][-1] == "7g.141gb"
    for alias in ("a100-80gb", "h100", "h200"):
        assert sku(alias).mig_geometry is A100_MIG_GEOMETRY


def test_a30_geometry_is_the_mig_user_guides():
    a30 = sku("a30")
    assert a30.mig_geometry is A30_MIG_GEOMETRY
    assert (A30_MIG_GEOMETRY.compute_slices, A30_MIG_GEOMETRY.memory_slices) == (4, 4)
    assert [
        (p.name, p.profile_id, p.max_count, p.placement_starts, p.placement_size, p.memory_mb)
        for p in a30.mig_profiles
    ] == [
        ("1g.6gb", 14, 4, (0, 1, 2, 3), 1, 5952),
        ("1g.6gb+me", 21, 1, (0, 1, 2, 3), 1, 5952),
        ("2g.12gb", 5, 2, (0, 2), 2, 11968),
        ("2g.12gb+me", 6, 1, (0, 2), 2, 11968),
        ("4g.24gb", 0, 1, (0,), 4, 24000),
    ]


@pytest.mark.parametrize("name", MIG_SKUS)
def test_mig_rows_fit_their_geometry_and_are_named_as_nvidia_smi_names_them(name):
    s = SKUS[name]
    g = s.mig_geometry
    assert g is not None and len(g.slots) == len(s.mig_profiles)
    total_bytes = s.memory_total_mb * 1024 * 1024
    for p in s.mig_profiles:
        assert p.compute_slices <= g.compute_slices
        assert all(start + p.placement_size <= g.memory_slices for start in p.placement_starts)
        assert p.max_count <= len(p.placement_starts)
        suffix = "+me" if p.name.endswith("+me") else ""
        assert mig_profile_name(p.compute_slices, p.memory_mb, total_bytes, suffix) == p.name
    # The largest profile takes the whole GPU.
    assert max(p.compute_slices for p in s.mig_profiles) == g.compute_slices


def test_pci_ids_are_unique_and_spelled_as_mig_parted_spells_them():
    ids = [s.pci_device_id for s in SKUS.values() if s.pci_device_id]
    assert len(ids) == len(set(ids))
    assert all(i.startswith("0x") and i.endswith("10DE") and len(i) == 10 for i in ids)


@pytest.mark.parametrize("name", MIG_SKUS)
def test_nvidias_all_balanced_names_each_mig_board_and_fits_its_table(name):
    s = SKUS[name]
    plan = load_plan(CONFIG_DEFAULT)
    entries = [
        e
        for e in plan.configs["all-balanced"]
        if any(f.upper() == s.pci_device_id.upper() for f in e.device_filter or ())
    ]
    assert entries, f"{name} ({s.pci_device_id}) is not in mig-parted's all-balanced"
    wanted = [
        PartitionRequest(profile=p) for p, n in entries[-1].mig_devices.items() for _ in range(n)
    ]
    placed = fit_mig(name, s.mig_profiles, wanted)
    assert len(placed) == len(wanted)


@pytest.mark.parametrize("name", sorted(SKUS))
def test_estimates_name_fields(name):
    assert set(SKUS[name].estimates) <= _FIELDS


def test_aliases_resolve_to_tabled_skus():
    for alias, full in SKU_ALIASES.items():
        assert sku(alias) is SKUS[full]
    assert sku("a800-80gb").pci_device_id == "0x20F310DE"
    assert sku("gh200").memory_total_mb == 97871
