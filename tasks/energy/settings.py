"""Power limits and clocks changed through the settings ledger, so that they always go back.

Energy control (the DVFS controller, the in-training tuner) changes a device only through
DeviceSettings. Each change is journalled in the inventory (hardware/inventory/settings.py)
with what the device had before, BEFORE the device is touched, and is put back on stop
(``restore``, ``restore_all``, leaving a ``with`` block, also on an exception), after a
crash and at lease end (``restore_stale``, which the next controller run calls first).
Plain Python, no Prefect.

The rules, in one place:
- validate first. A request is checked against what the device reports (power limit range,
  clock range) before anything is journalled; if the backend still refuses it
  (InvalidRequestError or UnsupportedError: nothing was touched) the journal entry is
  rewound, so a refused request changes and records nothing. Any other backend error after
  the journal write (no permission, a lost device) keeps the entry: the device's state is
  unknown, and putting the original back is harmless.
- put back only what the holder changed: its original power limit; locked clocks reset when
  there were none, else set back; applications clocks likewise.
- holders. A row lives while its holder renews it (``renew``, TTL like a lease). A holder
  that is a job id of the jobs registry lives, besides, only while its job holds a live
  lease on the device (the device or a partition of it): when that lease ends (released,
  expired, taken over) its rows are stale at once, whatever their TTL says, and
  ``restore_stale`` restores them. So a job's tuner uses holder = the job id, and a
  controller "dvfs:<run-id>" (any name that is not a job id).
- another holder's stale row on a device is restored first (``restore_stale`` for that
  device), then the new change is journalled from the device's fresh reading.
- a device gone. A row whose device is gone (DeviceLostError, the backend no longer lists
  node:index, or another uuid sits there now) is reported "lost" and DROPPED: a GPU back
  from a reset or a reboot comes back at its default power limit and clocks (the driver
  does not keep them), so nothing is left to put back; a kept row would block the slot for
  every later holder, and once NVML renumbered the survivors it would "restore" another
  physical device. Any other error keeps the row ("failed"): the next run retries it.
- only nodes the backend sees. NVML and hy-smi see the local host: a restore never touches
  (nor drops) another host's rows; that host's next run restores them.
- NVML and hy-smi cannot read locked clocks back (a backend knows only what its own process
  set): read by a fresh process the original is "no lock", and a restore resets them to
  the driver's default, which is what they are unless something outside gpuflow locked them.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

from gpuflow.hardware.backend import (
    Backend,
    ClockState,
    DeviceLostError,
    HardwareError,
    InvalidRequestError,
    UnsupportedError,
)
from gpuflow.hardware.inventory import Inventory, SettingRecord, SettingsConflictError

DEFAULT_TTL_S = 60.0  # a holder renews well within it (a controller each step)
RESTORE_TTL_S = 120.0  # how long a restorer holds the rows it is putting back
RestoreStatus = Literal["restored", "lost", "failed"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestoreOutcome:
    """What became of one journalled device: ``restored`` (row deleted), ``lost`` (the
    device is gone; row dropped) or ``failed`` (row kept for the next run)."""

    node: str
    index: int
    holder: str  # whose change was undone
    status: RestoreStatus
    detail: str
    record: SettingRecord


class SettingsRestoreError(HardwareError):
    """Some devices' settings could not be put back; their journal rows are kept."""

    def __init__(self, failures: Sequence[RestoreOutcome]) -> None:
        self.failures = list(failures)
        shown = "; ".join(f"{o.node}:{o.index}: {o.detail}" for o in self.failures)
        super().__init__(
            f"could not put back the settings of {shown} (journal rows kept: restore_stale "
            "retries them once they lapse)"
        )


def _require_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{what} must be an integer, got {value!r}")
    return value


def _in_range(where: str, what: str, value: int, lo: int, hi: int, unit: str) -> None:
    if not lo <= value <= hi:
        raise InvalidRequestError(
            f"{where}: {what} {value} {unit} is outside the device's {lo}..{hi} {unit}; "
            "nothing was changed or journalled"
        )


def _locked(c: ClockState) -> tuple[int, int] | None:
    if c.locked_min_mhz is None or c.locked_max_mhz is None:
        return None
    return (c.locked_min_mhz, c.locked_max_mhz)


def _applications(c: ClockState) -> tuple[int, int] | None:
    if c.applications_mem_clock_mhz is None or c.applications_sm_clock_mhz is None:
        return None
    return (c.applications_mem_clock_mhz, c.applications_sm_clock_mhz)


class DeviceSettings:
    """Power limits and clocks of devices changed by one ``holder``, journalled first.

    ``with DeviceSettings(backend, inventory, "dvfs:run-7") as s: s.apply_power_limit(...)``
    puts every device back on leaving the block, also on an exception.
    """

    def __init__(
        self, backend: Backend, inventory: Inventory, holder: str, *, ttl_s: float = DEFAULT_TTL_S
    ) -> None:
        if not isinstance(holder, str) or not holder.strip():
            raise InvalidRequestError(f"holder must be a non-empty string, got {holder!r}")
        self._backend, self._inventory, self.holder = backend, inventory, holder
        self.ttl_s = self._ttl(ttl_s)
        self._nodes: frozenset[str] | None = None

    @staticmethod
    def _ttl(ttl_s: object) -> float:
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not ttl_s > 0:
            raise InvalidRequestError(f"ttl_s must be a number of seconds > 0, got {ttl_s!r}")
        return float(ttl_s)

    # -- changes ---------------------------------------------------------------------------
    def apply_power_limit(self, node: str, index: int, limit_mw: int) -> SettingRecord:
        """Set the power limit (mW) after journalling the one the device has now."""
        _require_int(limit_mw, "limit_mw")

        def read() -> dict[str, Any]:
            limits = self._backend.power_limits(node, index)
            where = f"{node}:{index}"
            _in_range(
                where, "power limit", limit_mw, limits.min_limit_mw, limits.max_limit_mw, "mW"
            )
            return {"power_limit_mw": limit_mw, "original_power_limit_mw": limits.limit_mw}

        return self._apply(
            node, index, read, lambda: self._backend.set_power_limit_mw(node, index, limit_mw)
        )

    def apply_locked_clocks(
        self, node: str, index: int, min_mhz: int, max_mhz: int
    ) -> SettingRecord:
        """Lock the SM clock to [min_mhz, max_mhz] after journalling the lock there is now."""
        _require_int(min_mhz, "min_mhz")
        _require_int(max_mhz, "max_mhz")
        if min_mhz > max_mhz:
            raise InvalidRequestError(
                f"{node}:{index}: locked clocks {min_mhz}..{max_mhz} MHz have min > max; "
                "nothing was changed or journalled"
            )

        def read() -> dict[str, Any]:
            c = self._backend.clocks(node, index)
            where = f"{node}:{index}"
            for what, mhz in (("locked min clock", min_mhz), ("locked max clock", max_mhz)):
                _in_range(where, what, mhz, c.sm_clock_min_mhz, c.sm_clock_max_mhz, "MHz")
            return {"locked_mhz": (min_mhz, max_mhz), "original_locked_mhz": _locked(c)}

        return self._apply(
            node,
            index,
            read,
            lambda: self._backend.set_locked_clocks(node, index, min_mhz, max_mhz),
        )

    def apply_applications_clocks(
        self, node: str, index: int, mem_clock_mhz: int, sm_clock_mhz: int
    ) -> SettingRecord:
        """Set the applications clocks after journalling the ones there are now (NVIDIA;
        a DCU has none: the backend's UnsupportedError, nothing journalled)."""
        _require_int(mem_clock_mhz, "mem_clock_mhz")
        _require_int(sm_clock_mhz, "sm_clock_mhz")

        def read() -> dict[str, Any]:
            c = self._backend.clocks(node, index)
            where = f"{node}:{index}"
            lo, hi = c.sm_clock_min_mhz, c.sm_clock_max_mhz
            _in_range(where, "applications SM clock", sm_clock_mhz, lo, hi, "MHz")
            return {
                "applications_mhz": (mem_clock_mhz, sm_clock_mhz),
                "original_applications_mhz": _applications(c),
            }

        return self._apply(
            node,
            index,
            read,
            lambda: self._backend.set_applications_clocks(node, index, mem_clock_mhz, sm_clock_mhz),
        )

    def _apply(
        self,
        node: str,
        index: int,
        read: Callable[[], dict[str, Any]],
        change: Callable[[], None],
    ) -> SettingRecord:
        self._check_node(node)
        for attempt in range(2):
            values = read()  # validates, and reads the original: before any journal write
            device_uuid = self._backend.device(node, index).uuid
            row = self._inventory.setting(node, index)
            previous = row if row is not None and row.holder == self.holder else None
            try:
                written = self._inventory.record_setting(
                    self.holder, node, index, ttl_s=self.ttl_s, device_uuid=device_uuid, **values
                )
            except SettingsConflictError as exc:
                if not exc.stale or attempt:
                    raise
                # Another holder's change outlived it: put that back, then read afresh.
                restore_stale(self._inventory, self._backend, slots=[(node, index)])
                continue
            try:
                change()
            except (InvalidRequestError, UnsupportedError):
                # Refused before the device was touched: nothing may stay journalled.
                self._inventory.rewind_setting(self.holder, written, previous)
                raise
            return written
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    # -- putting back ----------------------------------------------------------------------
    def restore(self, node: str, index: int) -> RestoreOutcome | None:
        """Put node:index back as it was before this holder's changes and drop its row;
        None when this holder journalled nothing there. Raises SettingsRestoreError (the
        row kept) when the backend fails; a device gone is an outcome, not an error."""
        self._check_node(node)
        row = self._inventory.setting(node, index)
        if row is None or row.holder != self.holder:
            return None
        outcome = _restore_one(self._inventory, self._backend, row, self.holder)
        if outcome.status == "failed":
            raise SettingsRestoreError([outcome])
        return outcome

    def restore_all(self) -> list[RestoreOutcome]:
        """restore every device this holder journalled on the backend's nodes, each one
        tried even when another fails; then SettingsRestoreError if any failed."""
        rows = self._inventory.settings(self.holder, nodes=self._seen_nodes())
        outcomes = [_restore_one(self._inventory, self._backend, r, self.holder) for r in rows]
        failures = [o for o in outcomes if o.status == "failed"]
        if failures:
            raise SettingsRestoreError(failures)
        return outcomes

    def renew(self, ttl_s: float | None = None) -> int:
        """Keep this holder's rows live for ``ttl_s`` more (default: the holder's TTL);
        returns how many rows it holds (fewer than it changed: a restorer took some)."""
        ttl = self.ttl_s if ttl_s is None else self._ttl(ttl_s)
        return self._inventory.renew_settings(self.holder, ttl)

    def held(self) -> list[SettingRecord]:
        """This holder's journal rows, on every node."""
        return self._inventory.settings(self.holder)

    def __enter__(self) -> DeviceSettings:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.restore_all()
        except SettingsRestoreError as err:
            if exc is None:
                raise
            exc.add_note(str(err))  # the block's own exception stays the one raised

    # -- plumbing --------------------------------------------------------------------------
    def _seen_nodes(self) -> frozenset[str]:
        if self._nodes is None:
            self._nodes = frozenset(n.name for n in self._backend.discover())
        return self._nodes

    def _check_node(self, node: str) -> None:
        if node not in self._seen_nodes():
            raise InvalidRequestError(
                f"node {node!r} is not one backend {self._backend.name!r} sees "
                f"({', '.join(sorted(self._seen_nodes())) or 'none'}): change and restore its "
                "devices from its own host"
            )


def restore_stale(
    inventory: Inventory,
    backend: Backend,
    now: float | None = None,
    *,
    restorer: str | None = None,
    slots: Collection[tuple[str, int]] | None = None,
) -> list[RestoreOutcome]:
    """Put back every device on the backend's nodes (among ``slots``) whose journal row is
    stale at ``now`` (default: the inventory's clock): its holder stopped renewing, or it is
    a job that no longer leases the device. Each row is taken over first (so two restorers
    never both work on one) and dropped once restored or found lost; a failed one is kept
    and goes stale again after RESTORE_TTL_S. What the next controller run calls first."""
    nodes = [n.name for n in backend.discover()]
    who = restorer or f"restore:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    taken = inventory.claim_stale_settings(who, RESTORE_TTL_S, now=now, nodes=nodes, slots=slots)
    return [_restore_one(inventory, backend, row, who) for row in taken]


def _restore_one(
    inventory: Inventory, backend: Backend, row: SettingRecord, holder: str
) -> RestoreOutcome:
    status, detail = _put_back(backend, row)
    if status == "failed":
        log.warning("settings of %s:%s not restored (row kept): %s", row.node, row.index, detail)
    else:
        inventory.release_setting(holder, row.node, row.index)
        if status == "lost":
            log.warning("settings of %s:%s dropped: %s", row.node, row.index, detail)
    return RestoreOutcome(row.node, row.index, row.taken_from or row.holder, status, detail, row)


def _put_back(backend: Backend, row: SettingRecord) -> tuple[RestoreStatus, str]:
    node, index, where = row.node, row.index, f"{row.node}:{row.index}"
    try:
        found = backend.device(node, index).uuid
    except DeviceLostError as exc:
        return "lost", f"{where} is gone ({exc}); it comes back at its defaults"
    except InvalidRequestError as exc:
        return "lost", f"the backend no longer has {where} ({exc})"
    if row.device_uuid is not None and found != row.device_uuid:
        return "lost", (
            f"{where} is now {found}, not {row.device_uuid} whose settings were journalled: "
            "not touching the newcomer"
        )
    steps: list[tuple[str, Callable[[], None]]] = []
    if row.locked_mhz is not None:
        lock = row.original_locked_mhz
        steps.append(
            (
                "locked clocks",
                (lambda: backend.reset_locked_clocks(node, index))
                if lock is None
                else (lambda: backend.set_locked_clocks(node, index, *lock)),
            )
        )
    if row.applications_mhz is not None:
        steps.append(("applications clocks", lambda: _put_back_applications(backend, row)))
    if row.power_limit_mw is not None and row.original_power_limit_mw is not None:
        limit = row.original_power_limit_mw
        steps.append(("power limit", lambda: backend.set_power_limit_mw(node, index, limit)))
    done, errors = [], []
    for what, step in steps:
        try:
            step()
        except DeviceLostError as exc:
            return "lost", f"{where} went away while restoring its {what} ({exc})"
        except HardwareError as exc:
            errors.append(f"{what}: {exc}")
        else:
            done.append(what)
    if errors:
        return "failed", "; ".join(errors)
    return "restored", f"put back {', '.join(done) or 'nothing (nothing was changed)'}"


def _put_back_applications(backend: Backend, row: SettingRecord) -> None:
    original = row.original_applications_mhz
    if original is not None:
        backend.set_applications_clocks(row.node, row.index, *original)
        return
    # The twin reads "none set" as None and can reset them; NVML always reads a value (the
    # defaults when none were set), so it takes the branch above.
    reset = getattr(backend, "reset_applications_clocks", None)
    if reset is None:
        raise UnsupportedError(
            f"backend {backend.name!r} cannot reset applications clocks of "
            f"{row.node}:{row.index}, and no original ones were read to set back"
        )
    reset(row.node, row.index)
