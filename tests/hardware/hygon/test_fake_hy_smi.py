"""The fake hy-smi itself: an executable script that fails like the tool."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.hardware.hygon.helpers import FAKE, Fake


def test_fake_is_an_executable_script() -> None:
    assert os.access(FAKE, os.X_OK)
    assert FAKE.read_text().startswith("#!/usr/bin/env python3\n")


# -- the fake fails like the tool ------------------------------------------------------------------


def _run_fake(*args: str) -> tuple[int, str, str]:
    p = subprocess.run([str(FAKE), *args], capture_output=True, text=True, check=False)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--bogus-flag"], 2, "unrecognized arguments: --bogus-flag"),
        (["virtual", "-bogus"], 2, "unknown option"),
        (
            [
                "virtual",
                "-create-vdevices",
                "1",
                "-d",
                "9",
                "-vdevice-compute-units",
                "5",
                "-vdevice-memory-size",
                "64",
            ],
            1,
            "device 9 does not exist",
        ),
        (
            [
                "virtual",
                "-create-vdevices",
                "5",
                "-d",
                "0",
                "-vdevice-compute-units",
                "1,1,1,1,1",
                "-vdevice-memory-size",
                "1,1,1,1,1",
            ],
            1,
            "at most 4",
        ),
        (
            [
                "virtual",
                "-create-vdevices",
                "2",
                "-d",
                "0",
                "-vdevice-compute-units",
                "40,40",
                "-vdevice-memory-size",
                "64,64",
            ],
            1,
            "not enough compute units",
        ),
        (
            [
                "virtual",
                "-create-vdevices",
                "1",
                "-d",
                "0",
                "-vdevice-compute-units",
                "4",
                "-vdevice-memory-size",
                "99999",
            ],
            1,
            "not enough memory",
        ),
        (["mig", "-lgip"], 2, "invalid choice: 'mig'"),
    ],
)
def test_fake_fails_like_the_tool(fake: Fake, args: list[str], status: int, message: str) -> None:
    code, _out, err = _run_fake(*args)
    assert code == status and message in err
    assert fake.state()["vdevices"] == []
