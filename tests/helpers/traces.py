"""Where the tests read the Zeus power traces: the package's copy of ../shared/data/zeus-traces
(tasks/energy/data/zeus_traces, Apache-2.0)."""

from __future__ import annotations

from gpuflow.tasks.energy.traces import DEFAULT_TRACES_DIR

TRACES = DEFAULT_TRACES_DIR
V100 = TRACES / "summary_power_v100.csv"
