"""The device settings ledger: what energy control changed on a device, and what to put back.

Energy control (DVFS, the in-training tuner) changes power limits and clocks. Each change
is journalled here BEFORE the device is touched (tasks/energy/settings.py does the
touching): one row per device slot (node, index), owned by one holder ("dvfs:<run-id>", or
a job id for a job's tuner), carrying what the device had before that holder's first
change of each setting (the original, which a restore puts back) and what the holder
applied since. A crash between the journal write and the device change leaves a row that
restores the device to what it already is: harmless.

Rules:
- one holder per slot. The primary key is (node, index), so of two processes racing to
  journal a first change on one device exactly one INSERT wins; the other's transaction
  is retried, finds the winner's row and is refused (SettingsConflictError naming it).
- a row is its holder's while it is live: until ``expires_at`` (the holder renews all its
  rows with renew_settings) and, for a holder that is a job of the registry (gf_jobs has
  its id), only while that job holds a live lease on the device (the device itself or a
  partition of it), whatever ``expires_at`` says: a tuner dies with its job's lease.
- a row whose holder is no longer live is stale: it refuses every other holder until it
  has been restored. claim_stale_settings hands stale rows to a restorer with a
  compare-and-swap on the row's version, so a holder renewing at that moment either wins
  (and keeps its row) or loses and finds it gone; the restorer puts the originals back
  and releases the rows. Its own row lapsing does not stop a holder: as long as no
  restorer took it, renewing revives it, since its originals are still the true ones.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

from gpuflow.hardware.backend import HardwareError, InvalidRequestError
from gpuflow.hardware.inventory import schema
from gpuflow.hardware.inventory.base import (
    StoreBase,
    check_index,
    check_name,
    check_seconds,
    in_chunks,
)
from gpuflow.hardware.inventory.engine import WRITE_ATTEMPTS
from gpuflow.hardware.inventory.setting_records import (
    COLUMNS,
    Pair,
    SettingRecord,
    SettingsConflictError,
    check_pair,
    check_positive,
    optional_pair,
    setting_record,
    split_pair,
)
from sqlalchemy import Connection, Row, delete, insert, select, update

T = TypeVar("T")


class _LostRace(Exception):
    """A compare-and-swap matched no row: someone changed it meanwhile; re-read."""


class SettingsMixin(StoreBase):
    def record_setting(
        self,
        holder: str,
        node: str,
        index: int,
        *,
        ttl_s: float,
        device_uuid: str | None = None,
        power_limit_mw: int | None = None,
        original_power_limit_mw: int | None = None,
        locked_mhz: Pair | None = None,
        original_locked_mhz: Pair | None = None,
        applications_mhz: Pair | None = None,
        original_applications_mhz: Pair | None = None,
    ) -> SettingRecord:
        """Journal that ``holder`` is about to apply the given settings on node:index (and
        hold the row for ``ttl_s``). The ``original_*`` of a setting is kept only at the
        holder's first change of it; later changes replace only what is applied.

        Raises SettingsConflictError when another holder's row is there (live, or stale:
        restore it first), InvalidRequestError for bad input, for a job holder without a
        live lease on the device, or when the slot now holds another device than the row's.
        """
        check_name(holder, "settings holder")
        check_name(node, "node")
        check_index(index)
        ttl = check_seconds(ttl_s, "ttl_s")
        if device_uuid is not None:
            check_name(device_uuid, "device uuid")
        wanted: dict[str, tuple[int | Pair, int | Pair | None]] = {}
        if power_limit_mw is not None:
            wanted["power_limit"] = (
                check_positive(power_limit_mw, "power_limit_mw"),
                check_positive(original_power_limit_mw, "original_power_limit_mw"),
            )
        if locked_mhz is not None:
            lo_hi = check_pair(locked_mhz, "locked_mhz")
            if lo_hi[0] > lo_hi[1]:
                raise InvalidRequestError(f"locked_mhz {lo_hi} has min > max")
            wanted["locked_clocks"] = (
                lo_hi,
                optional_pair(original_locked_mhz, "original_locked_mhz"),
            )
        if applications_mhz is not None:
            wanted["applications_clocks"] = (
                check_pair(applications_mhz, "applications_mhz"),
                optional_pair(original_applications_mhz, "original_applications_mhz"),
            )
        if not wanted:
            raise InvalidRequestError(
                "record_setting needs at least one of power_limit_mw, locked_mhz, applications_mhz"
            )

        def work(conn: Connection) -> SettingRecord:
            now = self._clock()
            s = schema.device_settings
            row = conn.execute(select(s).where(s.c.node == node, s.c.device_index == index)).first()
            if row is not None and row.holder != holder:
                why = self._stale_reasons(conn, [row], now).get((node, index), "")
                raise SettingsConflictError(node, index, row.holder, row.expires_at, why)
            self._check_job_lease(conn, holder, node, index, now)
            if row is not None and device_uuid and row.device_uuid not in (None, device_uuid):
                raise InvalidRequestError(
                    f"{node}:{index} is now device {device_uuid}, but {holder!r} journalled "
                    f"settings of {row.device_uuid} there: restore those first"
                )
            values: dict[str, Any] = {"updated_at": now, "expires_at": now + ttl}
            for name, (applied, original) in wanted.items():
                applied_cols, original_cols = COLUMNS[name]
                values.update(
                    zip(applied_cols, split_pair(applied, len(applied_cols)), strict=True)
                )
                first = row is None or getattr(row, applied_cols[0]) is None
                if first:  # the holder's first change of it: what the device had is the original
                    values.update(
                        zip(original_cols, split_pair(original, len(original_cols)), strict=True)
                    )
            if row is None:
                values.update(
                    node=node,
                    device_index=index,
                    holder=holder,
                    device_uuid=device_uuid,
                    created_at=now,
                    version=1,
                )
                # A racing INSERT of the same slot raises IntegrityError; run_write retries,
                # and the retry reads the winner's row and refuses.
                conn.execute(insert(s).values(**values))
            else:
                values.update(version=row.version + 1, device_uuid=row.device_uuid or device_uuid)
                self._swap(conn, row, values)
            written = self._setting_row(conn, node, index)
            assert written is not None  # written in this very transaction
            return written

        return self._retrying(work)

    def rewind_setting(
        self, holder: str, written: SettingRecord, previous: SettingRecord | None
    ) -> bool:
        """Undo one record_setting whose device change the backend refused: the row goes
        back to ``previous`` (deleted when None), only if it is still ``written`` (same
        holder and version). False when it changed meanwhile (it was taken over)."""
        check_name(holder, "settings holder")
        s = schema.device_settings

        def work(conn: Connection) -> bool:
            where = (
                s.c.node == written.node,
                s.c.device_index == written.index,
                s.c.holder == holder,
                s.c.version == written.version,
            )
            if previous is None:
                return conn.execute(delete(s).where(*where)).rowcount == 1
            values: dict[str, Any] = {"version": written.version + 1, "updated_at": self._clock()}
            applied = (previous.power_limit_mw, previous.locked_mhz, previous.applications_mhz)
            originals = (
                previous.original_power_limit_mw,
                previous.original_locked_mhz,
                previous.original_applications_mhz,
            )
            for (cols_a, cols_o), a, o in zip(COLUMNS.values(), applied, originals, strict=True):
                values.update(zip(cols_a, split_pair(a, len(cols_a)), strict=True))
                values.update(zip(cols_o, split_pair(o, len(cols_o)), strict=True))
            return conn.execute(update(s).where(*where).values(**values)).rowcount == 1

        return self._write(work)

    def renew_settings(self, holder: str, ttl_s: float) -> int:
        """Extend every row of ``holder`` to now + ``ttl_s`` in one statement; returns how
        many. Rows a restorer took over are no longer the holder's and are not counted."""
        check_name(holder, "settings holder")
        ttl = check_seconds(ttl_s, "ttl_s")
        s = schema.device_settings

        def work(conn: Connection) -> int:
            now = self._clock()
            query = (
                update(s)
                .where(s.c.holder == holder)
                .values(updated_at=now, expires_at=now + ttl, version=s.c.version + 1)
            )
            return int(conn.execute(query).rowcount)

        return self._write(work)

    def release_setting(self, holder: str, node: str, index: int) -> SettingRecord | None:
        """Delete ``holder``'s row on node:index (once its device is restored) and return
        it; None when there is none of ``holder``'s there (released already, taken over)."""
        check_name(holder, "settings holder")
        check_name(node, "node")
        check_index(index)
        s = schema.device_settings

        def work(conn: Connection) -> SettingRecord | None:
            row = conn.execute(
                select(s).where(s.c.node == node, s.c.device_index == index, s.c.holder == holder)
            ).first()
            if row is None:
                return None
            gone = conn.execute(
                delete(s).where(
                    s.c.node == node, s.c.device_index == index, s.c.version == row.version
                )
            )
            if gone.rowcount != 1:
                raise _LostRace()
            return setting_record(row)

        return self._retrying(work)

    def setting(self, node: str, index: int) -> SettingRecord | None:
        """The row on node:index, live or not, or None."""
        check_name(node, "node")
        check_index(index)
        with self._read() as conn:
            return self._setting_row(conn, node, index)

    def settings(
        self, holder: str | None = None, *, nodes: Collection[str] | None = None
    ) -> list[SettingRecord]:
        """Every row (of ``holder``; on ``nodes``), live or not, by node and index."""
        s = schema.device_settings
        where = [] if holder is None else [s.c.holder == check_name(holder, "settings holder")]
        with self._read() as conn:
            return [setting_record(r) for r in self._setting_rows(conn, nodes, *where)]

    def stale_settings(
        self, now: float | None = None, *, nodes: Collection[str] | None = None
    ) -> list[SettingRecord]:
        """Rows whose holder is no longer live at ``now`` (default: the clock): expired, or
        a job holder that holds no live lease on the device (module docstring)."""
        at = self._clock() if now is None else check_seconds(now, "now", allow_zero=True)
        with self._read() as conn:
            rows = self._setting_rows(conn, nodes)
            reasons = self._stale_reasons(conn, rows, at)
        return [setting_record(r) for r in rows if (r.node, r.device_index) in reasons]

    def claim_stale_settings(
        self,
        restorer: str,
        ttl_s: float,
        *,
        now: float | None = None,
        nodes: Collection[str] | None = None,
        slots: Collection[tuple[str, int]] | None = None,
    ) -> list[SettingRecord]:
        """Take the stale rows (on ``nodes``; among ``slots``) over for ``restorer`` for
        ``ttl_s``, each by a compare-and-swap on its version, and return them as taken
        (``taken_from`` names whose change they undo). A restorer that dies before
        releasing them leaves rows that go stale again after ``ttl_s``."""
        check_name(restorer, "restorer")
        ttl = check_seconds(ttl_s, "ttl_s")
        at = None if now is None else check_seconds(now, "now", allow_zero=True)
        wanted = None if slots is None else {(n, check_index(i)) for n, i in slots}

        def work(conn: Connection) -> list[SettingRecord]:
            t = self._clock() if at is None else at
            rows = [
                r
                for r in self._setting_rows(conn, nodes)
                if wanted is None or (r.node, r.device_index) in wanted
            ]
            reasons = self._stale_reasons(conn, rows, t)
            taken = []
            for r in rows:
                if (r.node, r.device_index) not in reasons:
                    continue
                values = {
                    "holder": restorer,
                    "taken_from": r.taken_from or r.holder,
                    "updated_at": t,
                    "expires_at": t + ttl,
                    "version": r.version + 1,
                }
                # Matches nothing if the holder renewed it meanwhile: then it is not stale.
                if self._compare_and_swap(conn, r, values):
                    taken.append(self._setting_row(conn, r.node, r.device_index))
            return [x for x in taken if x is not None]

        return self._write(work)

    # -- inside a transaction ----------------------------------------------------------
    def _retrying(self, work: Callable[[Connection], T]) -> T:
        for _ in range(WRITE_ATTEMPTS):
            try:
                return self._write(work)
            except _LostRace:
                continue
        raise HardwareError("the settings ledger changed under every retry; try again")

    @staticmethod
    def _compare_and_swap(conn: Connection, row: Row[Any], values: dict[str, Any]) -> bool:
        """Write ``values`` to the row if its version is still ``row``'s; whether it was."""
        s = schema.device_settings
        result = conn.execute(
            update(s)
            .where(
                s.c.node == row.node,
                s.c.device_index == row.device_index,
                s.c.version == row.version,
            )
            .values(**values)
        )
        return result.rowcount == 1

    @classmethod
    def _swap(cls, conn: Connection, row: Row[Any], values: dict[str, Any]) -> None:
        if not cls._compare_and_swap(conn, row, values):
            raise _LostRace()

    @staticmethod
    def _setting_row(conn: Connection, node: str, index: int) -> SettingRecord | None:
        s = schema.device_settings
        row = conn.execute(select(s).where(s.c.node == node, s.c.device_index == index)).first()
        return None if row is None else setting_record(row)

    @staticmethod
    def _setting_rows(
        conn: Connection, nodes: Collection[str] | None, *where: Any
    ) -> list[Row[Any]]:
        s = schema.device_settings
        query = select(s).where(*where).order_by(s.c.node, s.c.device_index)
        if nodes is None:
            return list(conn.execute(query))
        names = sorted({check_name(n, "node") for n in nodes})
        out: list[Row[Any]] = []
        for chunk in in_chunks(names):
            out += conn.execute(query.where(s.c.node.in_(chunk)))
        return sorted(out, key=lambda r: (r.node, r.device_index))

    def _leased_slots(
        self, conn: Connection, owners: Sequence[str], now: float
    ) -> set[tuple[str, str, int]]:
        """(owner, node, index) of every device that ``owners`` hold a live lease on, the
        device itself or one of its partitions."""
        lt = schema.leases
        held: list[tuple[str, str]] = []
        for chunk in in_chunks(sorted(set(owners))):
            held += conn.execute(
                select(lt.c.owner, lt.c.resource_id).where(
                    lt.c.owner.in_(chunk), lt.c.expires_at > now
                )
            ).tuples()
        where = self._lease_location(conn, [rid for _, rid in held])
        return {(o, *where[rid][1:]) for o, rid in held if rid in where}  # type: ignore[misc]

    @staticmethod
    def _job_holders(conn: Connection, holders: Sequence[str]) -> set[str]:
        j = schema.jobs
        found: set[str] = set()
        for chunk in in_chunks(sorted(set(holders))):
            found |= set(conn.execute(select(j.c.job_id).where(j.c.job_id.in_(chunk))).scalars())
        return found

    def _check_job_lease(
        self, conn: Connection, holder: str, node: str, index: int, now: float
    ) -> None:
        if not self._job_holders(conn, [holder]):
            return
        if (holder, node, index) not in self._leased_slots(conn, [holder], now):
            raise InvalidRequestError(
                f"holder {holder!r} is a job of the registry but holds no live lease on "
                f"{node}:{index}: a job's tuner may change only the devices its job leases"
            )

    def _stale_reasons(
        self, conn: Connection, rows: Sequence[Row[Any]], now: float
    ) -> dict[tuple[str, int], str]:
        """(node, index) -> why its row's holder is no longer live, for the stale rows."""
        jobs = self._job_holders(conn, [r.holder for r in rows])
        leased = self._leased_slots(conn, sorted(jobs), now) if jobs else set()
        out = {}
        for r in rows:
            slot = (r.node, r.device_index)
            if r.expires_at <= now:
                out[slot] = f"its hold expired at {r.expires_at:.3f}"
            elif r.holder in jobs and (r.holder, *slot) not in leased:
                out[slot] = f"job {r.holder!r} holds no live lease on {r.node}:{r.device_index}"
        return out
