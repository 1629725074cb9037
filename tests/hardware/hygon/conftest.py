"""Every Hygon test: a fake hy-smi (tests/hardware/hygon/fake_hy_smi.py) on its own state file."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from gpuflow.hardware.hygon import HygonBackend

from tests.hardware.hygon.helpers import FAKE, NODE, Fake, fake_module


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fake:
    # `#!/usr/bin/env python3` should find this interpreter, not a slow pyenv shim.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    state, log = tmp_path / "hy-smi-state.json", tmp_path / "hy-smi-calls.log"
    monkeypatch.setenv("FAKE_HY_SMI_STATE", str(state))
    monkeypatch.setenv("FAKE_HY_SMI_LOG", str(log))
    monkeypatch.delenv("FAKE_HY_SMI_MODE", raising=False)
    f = Fake(state, log)
    f.write(fake_module.default_state())
    return f


@pytest.fixture
def backend(fake: Fake) -> HygonBackend:
    return HygonBackend(executable=str(FAKE), node_name=NODE, region="cn-north")
