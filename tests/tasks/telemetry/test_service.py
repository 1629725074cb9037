"""The exporter's start-up: with the threshold rules it loads neither torch, sklearn nor
Prefect (each costs seconds of CPU in every `gpuflow telemetry serve`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "sklearn", "prefect")

PROBE = """
import json, sys
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.telemetry.service import health_model, open_exporter

model, source = health_model(None)
exporter = open_exporter(SimBackend(), interval_s=5.0, model_uri=None)
print(json.dumps({"source": source, "model": type(model).__name__,
                  "loaded": [m for m in %r if m in sys.modules]}))
"""


def test_an_exporter_on_the_rules_imports_no_torch_sklearn_or_prefect(tmp_path: Path) -> None:
    env = {**os.environ, "GPUFLOW_HOME": str(tmp_path), "GPUFLOW_BACKEND": "sim"}
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "PREFECT_API_URL"):
        env.pop(key, None)
    out = subprocess.run(
        [sys.executable, "-c", PROBE % (HEAVY,)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["model"] == "RuleModel" and seen["source"].startswith("rules"), seen
    assert seen["loaded"] == [], f"the exporter imported {seen['loaded']}"
