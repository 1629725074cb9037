"""Fixtures of the inventory tests: a store on the test's clock, on SQLite and PostgreSQL
(``inventory_url``, tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gpuflow.hardware.inventory import Inventory

from tests.helpers.clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def inv(inventory_url: str, clock: ManualClock) -> Iterator[Inventory]:
    inventory = Inventory(inventory_url, now=clock)
    yield inventory
    inventory.close()
