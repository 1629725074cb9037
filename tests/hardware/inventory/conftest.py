"""Fixtures of the inventory tests: the fake backend and a store synced from it (``clock``
and ``inv`` come from tests/hardware/conftest.py)."""

from __future__ import annotations

import pytest
from gpuflow.hardware.inventory import Inventory

from tests.hardware.inventory.helpers import FakeBackend


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def synced(inv: Inventory, fake: FakeBackend) -> Inventory:
    inv.sync(fake)
    return inv
