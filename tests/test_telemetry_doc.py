"""docs/telemetry.md names every metric the exporter can serve, and its mapping table says
for each optional field exactly which backends read it (hardware/telemetry_fields.py)."""

from __future__ import annotations

import re
from pathlib import Path

from gpuflow.hardware.backend import TELEMETRY_FIELDS
from gpuflow.hardware.dcgm_mapping import ecc_specs, sample_specs
from gpuflow.hardware.telemetry_fields import HY_SMI, NVML_PAGE_RETIREMENT, NVML_ROW_REMAPPING
from gpuflow.tasks.telemetry.snapshot import catalogue, sample_name

DOC = (Path(__file__).parents[1] / "docs" / "telemetry.md").read_text()
ROW = re.compile(r"^\| `([^`]+)` \| `([A-Za-z_]+)[^`]*` \| [^|]+ \| [^|]+ \| ([^|]+) \|$", re.M)


def test_every_exported_metric_is_in_the_doc() -> None:
    names = {sample_name(s) for s in catalogue()} | {s.name for s in ecc_specs("aggregate")}
    missing = sorted(n for n in names if f"`{n}" not in DOC)
    assert not missing, f"docs/telemetry.md does not name {missing}"


def test_the_mapping_table_says_which_backends_read_each_field() -> None:
    rows = {(metric, field): where.strip() for field, metric, where in ROW.findall(DOC)}
    readers = {
        "NVML Ampere+": NVML_ROW_REMAPPING,
        "NVML Volta": NVML_PAGE_RETIREMENT,
        "hy-smi": HY_SMI,
    }
    for spec in sample_specs():
        where = rows[(spec.name, spec.source)]
        if spec.source not in TELEMETRY_FIELDS:
            assert where.startswith("all"), spec.name
            continue
        named = {r.strip() for r in where.split(",")}
        assert named == {r for r, fields in readers.items() if spec.source in fields}, spec.name
