"""The store itself: the default SQLite file in WAL mode, bad URLs, and several processes
creating a fresh store at once. On SQLite and PostgreSQL (``inventory_url``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Inventory

from tests.hardware.inventory.helpers import MP, FakeBackend


def test_default_store_is_sqlite_wal_in_gpuflow_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path / "gh"))
    with Inventory() as inv:
        assert inv.url == f"sqlite:///{tmp_path / 'gh' / 'inventory.db'}"
        inv.sync(FakeBackend())
    db = tmp_path / "gh" / "inventory.db"
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT count(*) FROM gf_devices").fetchone()[0] == 5
    # Durable: a new Inventory on the same file sees the same fleet.
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path / "gh"))
    assert [n.name for n in Inventory().nodes()] == ["n1", "n2", "spare1"]


def test_bad_url_is_a_clear_error() -> None:
    with pytest.raises(InvalidRequestError, match="not a database URL"):
        Inventory("no such url")


def _open_worker(url: str, i: int, go, out) -> None:  # type: ignore[no-untyped-def]
    try:
        go.wait(timeout=30)
        inv = Inventory(url)
        inv.record_job(f"job-{i}", {"i": i})
        out.put(None)
    except BaseException as exc:
        out.put(repr(exc))


def test_processes_creating_a_fresh_store_together(inventory_url: str) -> None:
    url = inventory_url
    n = 4
    go, out = MP.Barrier(n), MP.Queue()
    procs = [MP.Process(target=_open_worker, args=(url, i, go, out)) for i in range(n)]
    for p in procs:
        p.start()
    errors = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert errors == [None] * n
    assert len(Inventory(url).jobs()) == n
