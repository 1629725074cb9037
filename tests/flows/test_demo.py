"""`gpuflow demo` (what `make demo` runs), as a user runs it: the console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL

pytestmark = pytest.mark.integration


@pytest.mark.timeout(900)
def test_demo_prints_fleet_layout_and_summary() -> None:
    exe = Path(sys.executable).with_name("gpuflow")
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    done = subprocess.run([str(exe), "demo"], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "discovered fleet" in out and "partitioned layout" in out
    assert "3g.20gb@4" in out  # all-balanced needs the 3g at slice 4
    assert "impossible plan refused" in out and "layout_unchanged: True" in out
    assert "precision vs fp32" in out and "tour summary" in out
