"""Per-SKU facts: memory, clocks, power, thermal limits, throughput and MIG profiles.

Sources (see docs/hardware.md and ../shared/DESIGN.md section 4): NVML names and PCI
device ids as mig-parted uses them; clock and power ranges read from real
``nvidia-smi -q`` logs; memory, bandwidth and throughput of the boards without a log from
NVIDIA's datasheets; MIG profile ids, counts and placements from NVIDIA's MIG user guide
and real ``nvidia-smi mig -lgip/-lgipp`` output (A30). Fields listed in
``SkuSpec.estimates`` have no public measurement behind them (Hygon above all) and are
the twin's assumptions. On real GPUs NVML's own MIG profiles come first, MIG on or off;
these tables are the fallback (drivers that answer nothing with MIG off) and the twin's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError, PartitionProfile, Vendor
from gpuflow.hardware.mig_geometry import (  # noqa: F401 - re-exported
    A30_MIG_GEOMETRY,
    A100_MIG_GEOMETRY,
    MIG_COMPUTE_SLICES,
    MIG_MEMORY_SLICES,
    MigGeometry,
    MigSlot,
    build_mig_profiles,
    mig_enum_names,
)


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
    mig_geometry: MigGeometry | None = None  # the slots mig_profiles were built from
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
        mig_geometry=A100_MIG_GEOMETRY,
        mig_profiles=build_mig_profiles(
            ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
            mem,
            # What the card reports per instance (`nvidia-smi mig -lgip` in NVIDIA's MIG
            # user guide: 4.75, 9.75, 19.62, 39.50 GiB), a little under slices x 1/8.
            memory_mb=(4864, 4864, 9984, 9984, 20096, 20096, 40448),
        ),
        estimates=("thermal_resistance_c_per_w", "thermal_time_constant_s"),
    )


def _a100_80() -> SkuSpec:
    mem = 81920
    return replace(
        _a100_40(),
        name="NVIDIA A100-SXM4-80GB",
        memory_total_mb=mem,
        mem_clock_mhz=1593,
        memory_bandwidth_gbps=2039,
        pci_device_id="0x20B210DE",
        mig_profiles=build_mig_profiles(
            ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"), mem
        ),
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
        mig_geometry=A100_MIG_GEOMETRY,
        mig_profiles=build_mig_profiles(
            ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
            mem,
            # Per instance as the card reports it (NVIDIA's MIG user guide, H100 80GB).
            memory_mb=(9984, 9984, 20096, 20096, 40448, 40448, 81152),
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
    return replace(
        base,
        name="NVIDIA H200",
        memory_total_mb=mem,
        mem_clock_mhz=3201,
        memory_bandwidth_gbps=4800,
        pci_device_id="0x233510DE",
        mig_profiles=build_mig_profiles(
            ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"), mem
        ),
        estimates=base.estimates + ("power_min_limit_mw", "power_idle_mw"),
    )


# -- more GA100/GH100 boards -----------------------------------------------------------
# Names as NVML reports them and PCI ids as mig-parted's config-default.yaml lists them;
# memory, bandwidth, TFLOPS and power ceilings from NVIDIA's datasheets. Each is derived
# from the closest board above; what no log or datasheet of that board gives is carried
# over (_CARRIED: from the A100/H100 SXM logs) and listed in ``estimates``.
_MIG_A100_40 = ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
_MIG_80 = ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
_MIG_94 = ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb")
_MIG_96 = ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb")
_MIG_144 = ("1g.18gb", "1g.18gb+me", "1g.36gb", "2g.36gb", "3g.72gb", "4g.72gb", "7g.144gb")
_CARRIED = ("sm_clock_min_mhz", "sm_clock_default_app_mhz", "power_min_limit_mw", "power_idle_mw")


def _variant(
    base: SkuSpec, mig_names: tuple[str, ...], extra_estimates: tuple[str, ...], **changes: Any
) -> SkuSpec:
    mem = changes.get("memory_total_mb", base.memory_total_mb)
    profiles = build_mig_profiles(mig_names, mem, A100_MIG_GEOMETRY)
    estimates = tuple(dict.fromkeys(base.estimates + extra_estimates))
    return replace(base, mig_profiles=profiles, estimates=estimates, **changes)


def _a800_80() -> SkuSpec:
    # A800: the A100-80GB with NVLink cut to 400 GB/s (export variant); same datasheet
    # memory, clocks, 400 W and throughput.
    return _variant(
        _a100_80(), _MIG_80, _CARRIED, name="NVIDIA A800-SXM4-80GB", pci_device_id="0x20F310DE"
    )


def _a100_pcie_40() -> SkuSpec:
    return _variant(
        _a100_40(),
        _MIG_A100_40,
        (*_CARRIED, "mem_clock_mhz"),
        name="NVIDIA A100-PCIE-40GB",
        pci_device_id="0x20F110DE",
        power_min_limit_mw=150_000,
        power_max_limit_mw=250_000,
        power_idle_mw=35_000,
    )


def _a100_pcie_80() -> SkuSpec:
    return _variant(
        _a100_80(),
        _MIG_80,
        (*_CARRIED, "mem_clock_mhz"),
        name="NVIDIA A100 80GB PCIe",
        pci_device_id="0x20B510DE",
        mem_clock_mhz=1512,
        memory_bandwidth_gbps=1935,
        power_min_limit_mw=150_000,
        power_max_limit_mw=300_000,
        power_idle_mw=40_000,
    )


def _h800() -> SkuSpec:
    # H800 SXM: the H100 SXM with NVLink cut to 400 GB/s. "name": NVML's spelling unseen.
    return _variant(
        _h100(), _MIG_80, (*_CARRIED, "name"), name="NVIDIA H800", pci_device_id="0x232410DE"
    )


def _h100_pcie() -> SkuSpec:
    # HBM2e at 2.0 TB/s, 1755 MHz boost, 350 W, 51 TFLOPS fp32, 756 dense bf16.
    return _variant(
        _h100(),
        _MIG_80,
        (*_CARRIED, "mem_clock_mhz"),
        name="NVIDIA H100 PCIe",
        pci_device_id="0x233110DE",
        sm_clock_max_mhz=1755,
        sm_clock_default_app_mhz=1755,
        mem_clock_mhz=1593,
        memory_bandwidth_gbps=2000,
        fp32_tflops=51,
        reduced_tflops=756,
        power_max_limit_mw=350_000,
        power_idle_mw=50_000,
    )


def _h100_nvl() -> SkuSpec:
    # 94 GB HBM3 at 3.9 TB/s, 1785 MHz boost, 350-400 W, 60 TFLOPS fp32, 835 dense bf16.
    # NVML's total (95830 MiB) is inferred: the only total that names mig-parted's 3g.47gb.
    return _variant(
        _h100(),
        _MIG_94,
        (*_CARRIED, "memory_total_mb", "mem_clock_mhz"),
        name="NVIDIA H100 NVL",
        pci_device_id="0x232110DE",
        memory_total_mb=95830,
        sm_clock_max_mhz=1785,
        sm_clock_default_app_mhz=1785,
        memory_bandwidth_gbps=3938,
        fp32_tflops=60,
        reduced_tflops=835,
        power_max_limit_mw=400_000,
        power_idle_mw=60_000,
    )


def _h20() -> SkuSpec:
    # H20 (export variant): 96 GB HBM3 at 4.0 TB/s, 400 W, 44 TFLOPS fp32, 148 dense bf16.
    # Clocks are not published; NVML's total is taken from the GH200 (same 96 GB stack).
    return _variant(
        _h100(),
        _MIG_96,
        (*_CARRIED, "memory_total_mb", "sm_clock_max_mhz", "mem_clock_mhz"),
        name="NVIDIA H20",
        pci_device_id="0x232910DE",
        memory_total_mb=97871,
        memory_bandwidth_gbps=4000,
        fp32_tflops=44,
        reduced_tflops=148,
        power_max_limit_mw=400_000,
        power_idle_mw=60_000,
    )


def _gh200() -> SkuSpec:
    # The Hopper GPU of a GH200 superchip: 96 GB HBM3 at 4.0 TB/s (NVML reports 97871 MiB);
    # H100 SXM compute. The module's 450-1000 W covers CPU and GPU together, so the GPU's
    # own limit range is an estimate.
    return _variant(
        _h100(),
        _MIG_96,
        (*_CARRIED, "power_max_limit_mw", "mem_clock_mhz"),
        name="NVIDIA GH200 480GB",
        pci_device_id="0x234210DE",
        memory_total_mb=97871,
        memory_bandwidth_gbps=4000,
        power_max_limit_mw=900_000,
    )


def _gh200_144() -> SkuSpec:
    # GH200 with 144 GB HBM3e at 4.9 TB/s; NVML's total is inferred from the 7g.144gb name.
    return _variant(
        _gh200(),
        _MIG_144,
        ("memory_total_mb", "name"),
        name="NVIDIA GH200 144G HBM3e",
        pci_device_id="0x234810DE",
        memory_total_mb=146944,
        mem_clock_mhz=3201,
        memory_bandwidth_gbps=4900,
    )


def _a30() -> SkuSpec:
    mem = 24576  # MiB as NVML reports it (a real A30's nvidia-smi)
    return SkuSpec(
        name="NVIDIA A30",
        vendor="NVIDIA",
        memory_total_mb=mem,
        sm_clock_min_mhz=210,
        sm_clock_max_mhz=1440,
        sm_clock_default_app_mhz=1440,
        mem_clock_mhz=1215,
        power_min_limit_mw=100_000,
        power_max_limit_mw=165_000,
        power_idle_mw=30_000,
        memory_bandwidth_gbps=933,
        fp32_tflops=10.3,
        reduced_tflops=165,
        supports_bf16=True,
        supports_fp16=True,
        slowdown_temp_c=92,
        shutdown_temp_c=95,
        thermal_resistance_c_per_w=0.2,
        thermal_time_constant_s=60,
        pci_device_id="0x20B710DE",
        mig_geometry=A30_MIG_GEOMETRY,
        # Memory per profile as the real A30 reports it (5.81 / 11.69 / 23.44 GiB).
        mig_profiles=build_mig_profiles(
            ("1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"),
            mem,
            A30_MIG_GEOMETRY,
            memory_mb=(5952, 5952, 11968, 11968, 24000),
        ),
        estimates=(
            "sm_clock_min_mhz",
            "sm_clock_default_app_mhz",
            "power_min_limit_mw",
            "power_idle_mw",
            "slowdown_temp_c",
            "shutdown_temp_c",
            "thermal_resistance_c_per_w",
            "thermal_time_constant_s",
        ),
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
    for s in (
        _a100_40(),
        _a100_80(),
        _h100(),
        _h200(),
        _v100(),
        _hygon_z100(),
        _hygon_k100(),
        _a800_80(),
        _a100_pcie_40(),
        _a100_pcie_80(),
        _h800(),
        _h100_pcie(),
        _h100_nvl(),
        _h20(),
        _gh200(),
        _gh200_144(),
        _a30(),
    )
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
    "a800-80gb": "NVIDIA A800-SXM4-80GB",
    "a100-pcie-40gb": "NVIDIA A100-PCIE-40GB",
    "a100-pcie-80gb": "NVIDIA A100 80GB PCIe",
    "h800": "NVIDIA H800",
    "h100-pcie": "NVIDIA H100 PCIe",
    "h100-nvl": "NVIDIA H100 NVL",
    "h20": "NVIDIA H20",
    "gh200": "NVIDIA GH200 480GB",
    "gh200-144gb": "NVIDIA GH200 144G HBM3e",
    "a30": "NVIDIA A30",
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
