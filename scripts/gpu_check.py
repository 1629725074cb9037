"""Exercise NvmlBackend's read-only paths on a real NVIDIA GPU and say what it found.

    .venv/bin/python scripts/gpu_check.py            # tables
    .venv/bin/python scripts/gpu_check.py --json     # one JSON summary on stdout

It discovers the GPUs, reads MIG mode, GI profiles and their placements (as NVML lists
them, and the SKU table used while MIG is off), the partitions that exist, a telemetry
sample, clocks, power limits, and the energy counter before and after a short sleep.
It changes nothing on the device: no MIG mode, partition, clock or power-limit call.

Exit status: 0 all read paths answered, 1 some check failed (see "checks"), 2 NVML is
unavailable (no driver / library / GPU), with the reason.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from gpuflow.hardware.backend import DeviceInfo, HardwareError  # noqa: E402
from gpuflow.hardware.nvml import NvmlBackend  # noqa: E402
from gpuflow.hardware.skus import SKUS  # noqa: E402


class Report:
    def __init__(self) -> None:
        self.checks: list[dict[str, Any]] = []

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append({"check": name, "ok": bool(ok), "detail": detail})
        return ok

    def run(self, name: str, fn: Any) -> Any:
        """Call fn(); record a failed check (and return None) if it raises."""
        try:
            value = fn()
        except HardwareError as e:
            self.check(name, False, f"{type(e).__name__}: {e}")
            return None
        self.check(name, True)
        return value


def _profile_dict(p: Any) -> dict[str, Any]:
    d = asdict(p)
    d["placement_starts"] = list(p.placement_starts)
    return d


def check_device(b: NvmlBackend, dev: DeviceInfo, sleep_s: float, report: Report) -> dict[str, Any]:
    node, i = dev.node, dev.index
    tag = f"gpu{i}"
    out: dict[str, Any] = {"device": dev.to_dict()}
    known = SKUS.get(dev.sku)
    out["in_sku_table"] = known is not None  # unknown SKUs skip the table comparisons
    if known is not None and known.pci_device_id:
        report.check(
            f"{tag}.pci_device_id",
            known.pci_device_id == dev.pci_device_id,
            f"NVML {dev.pci_device_id}, table {known.pci_device_id}",
        )

    if "mig" in dev.partition_kinds:
        mode = report.run(f"{tag}.mig_mode", lambda: b.mig_mode(node, i))
        out["mig_mode"] = None if mode is None else {"current": mode[0], "pending": mode[1]}
        nvml_profiles = report.run(
            f"{tag}.mig_profiles_nvml", lambda: b.nvml_partition_profiles(node, i)
        )
        plan_profiles = report.run(f"{tag}.mig_profiles", lambda: b.partition_profiles(node, i))
        out["mig_profiles_nvml"] = [_profile_dict(p) for p in nvml_profiles or []]
        out["mig_profiles"] = [_profile_dict(p) for p in plan_profiles or []]
        out["mig_profiles_source"] = "nvml" if nvml_profiles else "sku-table"
        if nvml_profiles and known is not None and known.mig_profiles:
            got = sorted(p.name for p in nvml_profiles)
            want = sorted(p.name for p in known.mig_profiles)
            report.check(
                f"{tag}.mig_profile_names", set(want) <= set(got), f"NVML {got}, table {want}"
            )
            ids = {p.name: p.profile_id for p in nvml_profiles}
            report.check(
                f"{tag}.mig_profile_ids",
                all(ids.get(p.name) == p.profile_id for p in known.mig_profiles),
                f"NVML {ids}",
            )
        parts = report.run(f"{tag}.partitions", lambda: b.partitions(node, i))
        out["partitions"] = [p.to_dict() for p in parts or []]
    else:
        out["mig_mode"] = None
        profiles = report.run(f"{tag}.mig_profiles", lambda: b.partition_profiles(node, i))
        report.check(f"{tag}.no_mig_profiles", profiles == [], "no MIG: no profiles")

    fields = report.run(f"{tag}.telemetry_fields", lambda: b.telemetry_fields(node, i))
    out["telemetry_fields"] = sorted(fields) if fields is not None else None
    sample = report.run(f"{tag}.telemetry", lambda: b.telemetry(node, i))
    out["telemetry"] = sample.to_dict() if sample else None
    if sample is not None:
        report.check(f"{tag}.present", sample.present)
        if fields is not None:
            # What the probe declared readable is exactly what the sample carries.
            unreadable = sorted(sample.unreadable_fields())
            report.check(
                f"{tag}.telemetry_fields_honoured",
                not (set(unreadable) & fields),
                f"reads {sorted(fields)}; unreadable {unreadable}",
            )
        report.check(
            f"{tag}.memory_total",
            sample.memory_total_mb == dev.memory_total_mb,
            f"{sample.memory_total_mb} MiB",
        )
    clocks = report.run(f"{tag}.clocks", lambda: b.clocks(node, i))
    out["clocks"] = asdict(clocks) if clocks else None
    if clocks is not None:
        report.check(
            f"{tag}.clock_range",
            clocks.sm_clock_min_mhz <= clocks.sm_clock_max_mhz,
            f"{clocks.sm_clock_min_mhz}-{clocks.sm_clock_max_mhz} MHz, now {clocks.sm_clock_mhz}",
        )
    limits = report.run(f"{tag}.power_limits", lambda: b.power_limits(node, i))
    out["power_limits"] = asdict(limits) if limits else None
    if limits is not None:
        report.check(
            f"{tag}.power_limit_range",
            limits.min_limit_mw <= limits.limit_mw <= limits.max_limit_mw,
            f"{limits.limit_mw} mW in {limits.min_limit_mw}-{limits.max_limit_mw}",
        )

    e0 = report.run(f"{tag}.energy_before", lambda: b.energy_mj(node, i))
    t0 = time.monotonic()
    time.sleep(sleep_s)
    e1 = report.run(f"{tag}.energy_after", lambda: b.energy_mj(node, i))
    dt = time.monotonic() - t0
    energy: dict[str, Any] = {"before_mj": e0, "after_mj": e1, "interval_s": round(dt, 3)}
    if e0 is not None and e1 is not None:
        energy["delta_mj"] = e1 - e0
        energy["average_power_mw"] = round((e1 - e0) / dt) if dt > 0 else None
        report.check(f"{tag}.energy_monotonic", e1 >= e0, f"{e0} -> {e1} mJ")
    out["energy"] = energy
    return out


def render_text(summary: dict[str, Any]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text is enough without rich
        print(json.dumps(summary, indent=2, default=str))
        return
    con = Console()
    con.print(f"[bold]NVML[/bold] driver {summary['driver_version']} on {summary['node']}")
    for dev in summary["devices"]:
        d = dev["device"]
        con.print(
            f"\n[bold]GPU {d['index']}[/bold] {d['sku']}  {d['uuid']}  {d['memory_total_mb']} MiB  "
            f"pci {d['pci_device_id']}  MIG mode {dev.get('mig_mode')}"
        )
        if dev.get("mig_profiles"):
            t = Table(title=f"MIG profiles (source: {dev.get('mig_profiles_source')})")
            for col in ("name", "id", "compute", "memory MiB", "max", "starts", "size"):
                t.add_column(col)
            for p in dev["mig_profiles"]:
                t.add_row(
                    p["name"],
                    str(p["profile_id"]),
                    str(p["compute_slices"]),
                    str(p["memory_mb"]),
                    str(p["max_count"]),
                    str(p["placement_starts"]),
                    str(p["placement_size"]),
                )
            con.print(t)
        if dev.get("partitions"):
            t = Table(title="partitions")
            for col in ("uuid", "profile", "start", "size", "memory MiB"):
                t.add_column(col)
            for p in dev["partitions"]:
                t.add_row(
                    p["uuid"],
                    p["profile"],
                    str(p["placement_start"]),
                    str(p["placement_size"]),
                    str(p["memory_mb"]),
                )
            con.print(t)
        t = Table(title="telemetry, clocks, power, energy")
        t.add_column("field")
        t.add_column("value")
        for section in ("telemetry", "clocks", "power_limits", "energy"):
            for k, v in (dev.get(section) or {}).items():
                if k in ("node", "index"):
                    continue
                t.add_row(f"{section}.{k}", str(v))
        con.print(t)
    t = Table(title="checks")
    for col in ("check", "ok", "detail"):
        t.add_column(col)
    for c in summary["checks"]:
        t.add_row(c["check"], "[green]ok[/green]" if c["ok"] else "[red]FAIL[/red]", c["detail"])
    con.print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON summary")
    ap.add_argument("--sleep-s", type=float, default=1.0, help="energy-counter interval (s)")
    args = ap.parse_args(argv)

    ok, why = NvmlBackend.available()
    if not ok:
        if args.json:
            print(json.dumps({"available": False, "reason": why}))
        print(f"gpu_check: NVML unavailable: {why}", file=sys.stderr)
        return 2
    report = Report()
    with NvmlBackend() as b:
        summary: dict[str, Any] = {
            "available": True,
            "reason": why,
            "node": b.node,
            "driver_version": b.driver_version(),
            "devices": [],
        }
        [node] = b.discover()
        for dev in node.devices:
            summary["devices"].append(check_device(b, dev, args.sleep_s, report))
    summary["checks"] = report.checks
    summary["ok"] = all(c["ok"] for c in report.checks)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        render_text(summary)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
