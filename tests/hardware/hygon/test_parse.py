"""The hy-smi parsers on public samples."""

from __future__ import annotations

import json

import pytest
from gpuflow.hardware.backend import (
    HardwareError,
)
from gpuflow.hardware.hygon import parse as hp

# -- parsers on public samples -----------------------------------------------------------------

HAMI_VDEVICE_SAMPLE = """Virtual Device 0:
 Actual Device: 7
 Compute units: 5
 Global memory: 4294967296 bytes
- 5 -
Virtual Device 1:
 Actual Device: 7
 Compute units: 15
 Global memory: 8589934592 bytes
"""


def test_parse_virtual_info_on_the_hami_sample() -> None:
    rows = hp.parse_virtual_info(HAMI_VDEVICE_SAMPLE, virtual=True, what="t")
    assert [(r.index, r.actual_device, r.compute_units, r.memory_mb) for r in rows] == [
        (0, 7, 5, 4096),
        (1, 7, 15, 8192),
    ]
    phys = hp.parse_virtual_info(
        "\nDevice 0:\n Actual Device: 0\n Compute units: 60\n Global memory: 34342961152 bytes\n",
        virtual=False,
        what="t",
    )
    assert (phys[0].compute_units, phys[0].memory_mb) == (60, 32752)
    assert hp.parse_virtual_info("", virtual=True, what="t") == []
    with pytest.raises(HardwareError, match="lacks compute units"):
        hp.parse_virtual_info("Virtual Device 0:\n Actual Device: 1\n", virtual=True, what="t")
    with pytest.raises(HardwareError, match="no 'Device N:' block"):
        hp.parse_virtual_info("Permission denied", virtual=False, what="t")


def test_parse_card_json_samples() -> None:
    # categraf's documented hy_smi output, behind a banner line some builds print.
    text = "WARNING: hyhal version mismatch\n" + json.dumps(
        {
            "card0": {"Temperature (Sensor junction) (C)": "40", "HCU use (%)": "10"},
            "system": {"Driver version": "6.1.0"},
        }
    )
    cards = hp.parse_card_json(text, "t")
    assert list(cards) == [0]
    assert hp.card_number(cards[0], ("DCU use (%)", "HCU use (%)"), "t", text) == 10.0
    assert hp.card_number(cards[0], ("Unknown (W)",), "t", text) is None
    with pytest.raises(HardwareError, match="not a number"):
        hp.card_number({"x": "hot"}, ("x",), "t", text)
    with pytest.raises(HardwareError, match="no 'cardN'"):
        hp.parse_card_json('{"error": "no device"}', "t")
    with pytest.raises(HardwareError, match="invalid JSON"):
        hp.parse_card_json("{card0: 1}", "t")


def test_quote_truncates() -> None:
    assert hp.quote("a\nb") == repr("a\nb")
    q = hp.quote("x" * 1000, limit=10)
    assert q.startswith(repr("x" * 10)) and "990 more characters" in q


def test_parse_clock_levels_text() -> None:
    text = (
        "HCU[0]\t\t: Supported sclk frequencies on HCU0\n"
        "HCU[0]\t\t: 0: 300Mhz\nHCU[0]\t\t: 1: 1500Mhz *\nHCU[0]\t\t: \n"
        "HCU[0]\t\t: Supported mclk frequencies on HCU0\nHCU[0]\t\t: 0: 1000Mhz *\n"
    )
    levels = hp.parse_clock_levels(text, "t")[0]
    assert levels["sclk"].levels == ((0, 300), (1, 1500)) and levels["sclk"].current_mhz == 1500
    assert levels["mclk"].current_mhz == 1000
    with pytest.raises(HardwareError):
        hp.parse_clock_levels("nothing here", "t")


def test_parse_mig_tables_in_nvidia_smi_layout() -> None:
    lgip = """+-----------------------------------------------------------------------------+
| GPU instance profiles:                                                      |
| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                              Free/Total   GiB              CE    JPEG  OFA  |
|=============================================================================|
|   0  MIG 1g.5gb        19     7/7        4.75       No     14     0     0   |
|                                                             1     0     0   |
+-----------------------------------------------------------------------------+
"""
    (row,) = hp.parse_mig_profiles(lgip, "t")
    assert (row.name, row.profile_id, row.free, row.total, row.memory_mb, row.compute_units) == (
        "1g.5gb",
        19,
        7,
        7,
        4864,
        14,
    )
    assert hp.parse_mig_profiles("No MIG-enabled devices found.", "t") == []
    placements = hp.parse_mig_placements("GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1", "t")
    assert placements == {(0, 19): ((0, 1, 2, 3, 4, 5, 6), 1)}
    lgi = "| GPU instances: |\n|   0  MIG 3g.20gb          9        2          4:4     |\n"
    (inst,) = hp.parse_mig_instances(lgi, "t")
    assert (inst.name, inst.profile_id, inst.instance_id, inst.start, inst.size) == (
        "3g.20gb",
        9,
        2,
        4,
        4,
    )
    assert hp.parse_mig_instances("No GPU instances found: Not Found", "t") == []
