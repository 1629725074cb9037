"""What the device settings ledger (settings.py) hands out, its error, and how a row's
column pairs map to its records' fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuflow.hardware.backend import HardwareError, InvalidRequestError
from sqlalchemy import Row

Pair = tuple[int, int]
# setting -> (applied columns, original columns); a pair is (min, max) or (mem, sm).
COLUMNS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "power_limit": (("applied_power_limit_mw",), ("original_power_limit_mw",)),
    "locked_clocks": (
        ("applied_locked_min_mhz", "applied_locked_max_mhz"),
        ("original_locked_min_mhz", "original_locked_max_mhz"),
    ),
    "applications_clocks": (
        ("applied_applications_mem_mhz", "applied_applications_sm_mhz"),
        ("original_applications_mem_mhz", "original_applications_sm_mhz"),
    ),
}

FIELDS = {
    "power_limit": "power_limit_mw",
    "locked_clocks": "locked_mhz",
    "applications_clocks": "applications_mhz",
}


@dataclass(frozen=True)
class SettingRecord:
    """One ledger row. ``power_limit_mw``, ``locked_mhz`` (min, max) and
    ``applications_mhz`` (mem, sm) are what the holder applied, None for a setting it did
    not touch; ``original_*`` is what the device had before (None for locked or
    applications clocks: none were set, a restore resets them)."""

    node: str
    index: int
    holder: str
    device_uuid: str | None
    power_limit_mw: int | None
    original_power_limit_mw: int | None
    locked_mhz: Pair | None
    original_locked_mhz: Pair | None
    applications_mhz: Pair | None
    original_applications_mhz: Pair | None
    taken_from: str | None  # set when a restorer holds it: whose change it undoes
    created_at_s: float
    updated_at_s: float
    expires_at_s: float
    version: int

    def expired(self, now_s: float) -> bool:
        return self.expires_at_s <= now_s

    @property
    def changed(self) -> tuple[str, ...]:
        """The settings this holder changed: power_limit, locked_clocks, applications_clocks."""
        applied = (self.power_limit_mw, self.locked_mhz, self.applications_mhz)
        return tuple(
            name for name, value in zip(COLUMNS, applied, strict=True) if value is not None
        )


class SettingsConflictError(HardwareError):
    """Another holder's settings are journalled on the device: live (wait, or have it
    restore), or stale (``stale`` is why: restore them first, e.g. restore_stale)."""

    def __init__(
        self, node: str, index: int, holder: str, expires_at_s: float, stale: str = ""
    ) -> None:
        self.node, self.index, self.holder = node, index, holder
        self.expires_at_s, self.stale = expires_at_s, stale
        where = f"{node}:{index}"
        if stale:
            message = (
                f"device {where} still carries the settings {holder!r} changed ({stale}): "
                "they must be restored first (restore_stale)"
            )
        else:
            message = (
                f"device {where} has power/clock settings journalled by {holder!r} until "
                f"{expires_at_s:.3f}: one holder at a time changes a device"
            )
        super().__init__(message)


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_pair(value: object, what: str) -> Pair:
    if isinstance(value, tuple | list) and len(value) == 2 and all(map(_is_positive_int, value)):
        return (int(value[0]), int(value[1]))
    raise InvalidRequestError(f"{what} must be a pair of positive integers (MHz), got {value!r}")


def optional_pair(value: object, what: str) -> Pair | None:
    """None (no such setting: none was set) or a pair of positive integers."""
    return None if value is None else check_pair(value, what)


def check_positive(value: object, what: str) -> int:
    if not _is_positive_int(value):
        raise InvalidRequestError(f"{what} must be a positive integer, got {value!r}")
    return int(value)  # type: ignore[call-overload]


def split_pair(value: int | Pair | None, width: int) -> tuple[int | None, ...]:
    if value is None:
        return (None,) * width
    return (value,) if isinstance(value, int) else tuple(value)


def _joined(row: Row[Any], columns: tuple[str, ...]) -> Any:
    values = tuple(getattr(row, c) for c in columns)
    if any(v is None for v in values):
        return None
    return values[0] if len(values) == 1 else values


def setting_record(row: Row[Any]) -> SettingRecord:
    parts: dict[str, Any] = {}
    for name, (applied, original) in COLUMNS.items():
        key = FIELDS[name]
        parts[key] = _joined(row, applied)
        parts[f"original_{key}"] = _joined(row, original)
    return SettingRecord(
        node=row.node,
        index=int(row.device_index),
        holder=row.holder,
        device_uuid=row.device_uuid,
        taken_from=row.taken_from,
        created_at_s=row.created_at,
        updated_at_s=row.updated_at,
        expires_at_s=row.expires_at,
        version=int(row.version),
        **parts,
    )
