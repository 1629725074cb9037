"""A process that changes one twin device through DeviceSettings and then blocks, for the
SIGKILL test (tests/tasks/energy/test_settings.py). It prints "ready" on stdout once the
power limit and the locked clocks are applied, inside a ``with DeviceSettings(...)`` block
that a SIGKILL never lets it leave, and then waits until it is killed.

    python tests/helpers/settings_holder.py URL HOLDER NODE INDEX LIMIT_MW MIN_MHZ MAX_MHZ TTL_S

The twin and the inventory's default location follow GPUFLOW_HOME, inherited from the test.
"""

from __future__ import annotations

import signal
import sys

from gpuflow.hardware.inventory import Inventory
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.energy.settings import DeviceSettings


def main(argv: list[str]) -> None:
    url, holder, node, index, limit_mw, min_mhz, max_mhz, ttl_s = argv
    with DeviceSettings(SimBackend(), Inventory(url), holder, ttl_s=float(ttl_s)) as settings:
        settings.apply_power_limit(node, int(index), int(limit_mw))
        settings.apply_locked_clocks(node, int(index), int(min_mhz), int(max_mhz))
        print("ready", flush=True)
        while True:  # until SIGKILL: the block's restore must never run
            signal.pause()


if __name__ == "__main__":
    main(sys.argv[1:])
