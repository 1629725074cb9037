"""What a rank process imports: a gang's ranks are fresh processes (one per unit, again
at every restart), so what they load is start-up time every gang pays, N times."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

from gpuflow.tasks.training.storage import LocalStorage

# What rank_main imports, at the top of worker.py and inside it, and what it unpickles.
_RANK_IMPORTS = """
import pickle, sys
import gpuflow.tasks.training.distributed.worker
from gpuflow.tasks.training.control import FencedControl, step_observers
from gpuflow.tasks.training.loop import train_loop
store = pickle.loads(sys.stdin.buffer.read())
store.put_bytes("probe", b"1")
print(",".join(m for m in ("prefect", "mlflow", "sqlalchemy") if m in sys.modules))
"""


def test_a_rank_trains_and_reads_its_store_without_prefect_mlflow_or_the_database(
    tmp_path: Path,
) -> None:
    store = LocalStorage(tmp_path / "ckpt")
    done = subprocess.run(
        [sys.executable, "-c", _RANK_IMPORTS],
        input=pickle.dumps(store),
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().strip() == ""  # none of them was imported
    assert store.get_bytes("probe") == b"1"
