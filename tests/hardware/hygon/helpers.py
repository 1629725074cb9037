"""What the Hygon tests share: the fake hy-smi script, its state and call log, and requests."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from gpuflow.hardware.backend import PartitionRequest

FAKE = Path(__file__).with_name("fake_hy_smi.py")
NODE = "dcu-node-1"

_spec = importlib.util.spec_from_file_location("fake_hy_smi", FAKE)
assert _spec and _spec.loader
fake_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake_module)


class Fake:
    def __init__(self, state: Path, log: Path) -> None:
        self.state_path = state
        self.log = log

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def clear(self) -> None:
        self.log.write_text("")

    def state(self) -> dict:
        return json.loads(self.state_path.read_text())

    def write(self, state: dict) -> None:
        self.state_path.write_text(json.dumps(state))

    def edit(self, fn) -> None:  # type: ignore[no-untyped-def]
        s = self.state()
        fn(s)
        self.write(s)


def mutating(call: list[str]) -> bool:
    return any(
        a in call
        for a in (
            "-create-vdevices",
            "-destroy-vdevice",
            "-cgi",
            "-dci",
            "-dgi",
            "--setsclk",
            "--resetclocks",
            "--setpoweroverdrive",
        )
    )


def vdcu(cu: object, mem: object) -> PartitionRequest:
    return PartitionRequest(profile="vdcu", compute_units=cu, memory_mb=mem)  # type: ignore[arg-type]


HAMI = [vdcu(5, 4096), vdcu(15, 8192), vdcu(20, 8192), vdcu(20, 8192)]
