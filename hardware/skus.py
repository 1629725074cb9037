"""Per-SKU facts: memory, clocks, power, thermal limits, throughput and MIG profiles.

Sources (see docs/hardware.md and ../shared/DESIGN.md section 4): NVML names and PCI
device ids as mig-parted uses them; clock and power ranges read from real
``nvidia-smi -q`` logs; MIG profile ids, counts and placements from NVIDIA's MIG user
guide. Figures marked ``estimate`` in ``SkuSpec.estimates`` have no public measurement
behind them (Hygon above all) and are the twin's assumptions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuflow.hardware.backend import InvalidRequestError, PartitionProfile, Vendor

# (NVML enum name, GI profile id, compute slices, memory slices, max count, placement starts)
# Placements are the A100 rules of NVIDIA's MIG user guide; H100/H200 publish the same
# start:size table. They live per SKU so a SKU with other rules only edits its own row.
_MIG_GEOMETRY: tuple[tuple[str, int, int, int, int, tuple[int, ...]], ...] = (
    ("1_SLICE", 19, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    ("1_SLICE_REV1", 20, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    ("1_SLICE_REV2", 15, 1, 2, 4, (0, 2, 4, 6)),
    ("2_SLICE", 14, 2, 2, 3, (0, 2, 4)),
    ("3_SLICE", 9, 3, 4, 2, (0, 4)),
    ("4_SLICE", 5, 4, 4, 1, (0,)),
    ("7_SLICE", 0, 7, 8, 1, (0,)),
)
MIG_COMPUTE_SLICES = 7
MIG_MEMORY_SLICES = 8


def _mig_profiles(names: tuple[str, ...], memory_total_mb: int) -> tuple[PartitionProfile, ...]:
    slice_mb = memory_total_mb // MIG_MEMORY_SLICES
    out = []
    for name, (_enum, gi_id, cslices, mslices, max_count, starts) in zip(
        names, _MIG_GEOMETRY, strict=True
    ):
        out.append(
            PartitionProfile(
                name=name,
                kind="mig",
                profile_id=gi_id,
                compute_slices=cslices,
                memory_mb=mslices * slice_mb,
                max_count=max_count,
                placement_starts=starts,
                placement_size=mslices,
            )
        )
    return tuple(out)


def mig_enum_names() -> tuple[str, ...]:
    """NVML enum suffixes (NVML_GPU_INSTANCE_PROFILE_<name>) in table order."""
    return tuple(g[0] for g in _MIG_GEOMETRY)


@dataclass(frozen=True)
class SkuSpec:
    name: str  # NVML name or Hygon product name
    vendor: Vendor
    memory_total_mb: int
    sm_clock_min_mhz: int  # idle clock
    sm_clock_max_mhz: int
    sm_clock_default_app_mhz: int
    mem_clock_mhz: int
    power_min_limit_mw: int
    power_max_limit_mw: int
    power_idle_mw: int
    memory_bandwidth_gbps: float
    fp32_tflops: float
    reduced_tflops: float  # best of bf16/fp16 dense tensor throughput
    supports_bf16: bool
    supports_fp16: bool
    slowdown_temp_c: float  # HW slowdown threshold (nvidia-smi -q "GPU Slowdown Temp")
    shutdown_temp_c: float
    thermal_resistance_c_per_w: float  # twin's RC model: steady rise above ambient per watt
    thermal_time_constant_s: float
    pci_device_id: str | None = None
    mig_profiles: tuple[PartitionProfile, ...] = ()
    vdcu_max_count: int = 0
    compute_units: int = 0  # Hygon CUs, the vDCU compute budget
    estimates: tuple[str, ...] = field(default=())  # fields without a public source

    @property
    def supports_mig(self) -> bool:
        return bool(self.mig_profiles)

    @property
    def supports_vdcu(self) -> bool:
        return self.vdcu_max_count > 0

    @property
    def power_default_limit_mw(self) -> int:
        return self.power_max_limit_mw

    def mig_profile(self, name: str) -> PartitionProfile:
        for p in self.mig_profiles:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.mig_profiles) or "none (no MIG)"
        raise InvalidRequestError(f"{self.name}: unknown MIG profile {name!r}; known: {known}")


def _a100_40() -> SkuSpec:
    mem = 40960
    return SkuSpec(
        name="NVIDIA A100-SXM4-40GB",
        vendor="NVIDIA",
        memory_total_mb=mem,
        sm_clock_min_mhz=210,
        sm_clock_max_mhz=1410,
        sm_clock_default_app_mhz=1095,
        mem_clock_mhz=1215,
        power_min_limit_mw=100_000,
        power_max_limit_mw=400_000,
        power_idle_mw=60_000,
        memory_bandwidth_gbps=1555,
        fp32_tflops=19.5,
        reduced_tflops=312,
        supports_bf16=True,
        supports_fp16=True,
        slowdown_temp_c=92,
        shutdown_temp_c=95,
        thermal_resistance_c_per_w=0.1,
        thermal_time_constant_s=60,
        pci_device_id="0x20B010DE",
        mig_profiles=_mig_profiles(
            ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"), mem
        ),
        estimates=("thermal_resistance_c_per_w", "thermal_time_constant_s"),
    )


def _a100_80() -> SkuSpec:
    mem = 81920
    base = _a100_40()
    return SkuSpec(
        **{
            **base.__dict__,
            "name": "NVIDIA A100-SXM4-80GB",
            "memory_total_mb": mem,
            "mem_clock_mhz": 1593,
            "memory_bandwidth_gbps": 2039,
            "pci_device_id": "0x20B210DE",
            "mig_profiles": _mig_profiles(
                ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
                mem,
            ),
        }
    )


def _h100() -> SkuSpec:
    mem = 81559  # MiB as NVML reports it; MIG names ("3g.40gb") derive from it
    return SkuSpec(
        name="NVIDIA H100 80GB HBM3",
        vendor="NVIDIA",
        memory_total_mb=mem,
        sm_clock_min_mhz=345,
        sm_clock_max_mhz=1980,
        sm_clock_default_app_mhz=1980,
        mem_clock_mhz=2619,
        power_min_limit_mw=200_000,
        power_max_limit_mw=700_000,
        power_idle_mw=90_000,
        memory_bandwidth_gbps=3350,
        fp32_tflops=67,
        reduced_tflops=989,
        supports_bf16=True,
        supports_fp16=True,
        slowdown_temp_c=87,
        shutdown_temp_c=92,
        thermal_resistance_c_per_w=0.06,
        thermal_time_constant_s=60,
        pci_device_id="0x233010DE",
        mig_profiles=_mig_profiles(
            ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"), mem
        ),
        estimates=(
            "thermal_resistance_c_per_w",
            "thermal_time_constant_s",
            "slowdown_temp_c",
            "shutdown_temp_c",
            "sm_clock_default_app_mhz",
        ),
    )


def _h200() -> SkuSpec:
    mem = 143771  # MiB as NVML reports it
    base = _h100()
    return SkuSpec(
        **{
            **base.__dict__,
            "name": "NVIDIA H200",
            "memory_total_mb": mem,
            "mem_clock_mhz": 3201,
            "memory_bandwidth_gbps": 4800,
            "pci_device_id": "0x233510DE",
            "mig_profiles": _mig_profiles(
                ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
                mem,
            ),
            "estimates": base.estimates + ("power_min_limit_mw", "power_idle_mw"),
        }
    )


def _v100() -> SkuSpec:
    return SkuSpec(
        name="Tesla V100-SXM2-32GB",
        vendor="NVIDIA",
        memory_total_mb=32768,
        sm_clock_min_mhz=135,
        sm_clock_max_mhz=1530,
        sm_clock_default_app_mhz=1312,
        mem_clock_mhz=877,
        power_min_limit_mw=100_000,
        power_max_limit_mw=300_000,
        power_idle_mw=41_000,
        memory_bandwidth_gbps=900,
        fp32_tflops=15.7,
        reduced_tflops=125,
        supports_bf16=False,
        supports_fp16=True,
        slowdown_temp_c=87,
        shutdown_temp_c=90,
        thermal_resistance_c_per_w=0.13,
        thermal_time_constant_s=60,
        pci_device_id="0x1DB510DE",
        estimates=("thermal_resistance_c_per_w", "thermal_time_constant_s"),
    )


def _hygon_z100() -> SkuSpec:
    # Hygon publishes little: memory from its spec sheet, the rest are estimates. The 60
    # compute units match HAMi's vDCU example (5+15+20+20 CUs on one DCU).
    return SkuSpec(
        name="Hygon DCU Z100",
        vendor="Hygon",
        memory_total_mb=32768,
        sm_clock_min_mhz=300,
        sm_clock_max_mhz=1500,
        sm_clock_default_app_mhz=1500,
        mem_clock_mhz=1000,
        power_min_limit_mw=100_000,
        power_max_limit_mw=300_000,
        power_idle_mw=50_000,
        memory_bandwidth_gbps=1024,
        fp32_tflops=10.1,
        reduced_tflops=32.0,
        supports_bf16=False,
        supports_fp16=True,
        slowdown_temp_c=90,
        shutdown_temp_c=100,
        thermal_resistance_c_per_w=0.13,
        thermal_time_constant_s=60,
        vdcu_max_count=4,
        compute_units=60,
        estimates=(
            "sm_clock_min_mhz",
            "sm_clock_max_mhz",
            "mem_clock_mhz",
            "power_min_limit_mw",
            "power_max_limit_mw",
            "power_idle_mw",
            "memory_bandwidth_gbps",
            "fp32_tflops",
            "reduced_tflops",
            "slowdown_temp_c",
            "shutdown_temp_c",
            "thermal_resistance_c_per_w",
            "thermal_time_constant_s",
            "compute_units",
        ),
    )


def _hygon_k100() -> SkuSpec:
    base = _hygon_z100()
    return SkuSpec(
        **{
            **base.__dict__,
            "name": "Hygon DCU K100",
            "memory_total_mb": 65536,
            "fp32_tflops": 24.5,
            "reduced_tflops": 100.0,
            "supports_bf16": True,
            "compute_units": 120,
            "power_max_limit_mw": 350_000,
        }
    )


SKUS: dict[str, SkuSpec] = {
    s.name: s
    for s in (_a100_40(), _a100_80(), _h100(), _h200(), _v100(), _hygon_z100(), _hygon_k100())
}

# Short names people type in cluster specs and requests.
SKU_ALIASES: dict[str, str] = {
    "a100-40gb": "NVIDIA A100-SXM4-40GB",
    "a100-80gb": "NVIDIA A100-SXM4-80GB",
    "h100": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200",
    "v100": "Tesla V100-SXM2-32GB",
    "dcu-z100": "Hygon DCU Z100",
    "dcu-k100": "Hygon DCU K100",
}


def sku(name: str) -> SkuSpec:
    """Look a SKU up by its full name or a short alias (case-insensitive alias)."""
    if name in SKUS:
        return SKUS[name]
    alias = SKU_ALIASES.get(name.lower())
    if alias:
        return SKUS[alias]
    known = ", ".join(sorted(SKU_ALIASES))
    raise InvalidRequestError(f"unknown SKU {name!r}; known: {known} (or full NVML names)")
