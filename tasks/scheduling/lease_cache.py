"""The leases as a scheduler service last read them, and when each is due again.

A renewal is not in the inventory's change journal (it only moves an expiry), so the
service keeps the expiry it last saw of every lease and looks again when that passes:
renewed meanwhile by its holder (nothing changed), or lapsed (its job lost a unit). The
expiries are a heap: a pass pays for the leases that are due, not for all 10,000.
"""

from __future__ import annotations

import heapq

from gpuflow.hardware.inventory import Lease


class LeaseCache:
    def __init__(self) -> None:
        self.by_rid: dict[str, Lease] = {}
        self.by_owner: dict[str, set[str]] = {}
        self._expiry: list[tuple[float, str]] = []  # (expires_at_s, resource id)

    def reset(self, leases: list[Lease] | tuple[Lease, ...]) -> None:
        self.by_rid, self.by_owner = {}, {}
        self._expiry = []
        for lease in leases:
            self.put(lease)

    def get(self, rid: str) -> Lease | None:
        return self.by_rid.get(rid)

    def owned_by(self, owner: str) -> set[str]:
        return self.by_owner.get(owner, set())

    def put(self, lease: Lease) -> None:
        """Cache ``lease`` (replacing what was known of its resource)."""
        self.pop(lease.resource_id)
        rid = lease.resource_id
        self.by_rid[rid] = lease
        self.by_owner.setdefault(lease.owner, set()).add(rid)
        heapq.heappush(self._expiry, (lease.expires_at_s, rid))

    def pop(self, rid: str) -> Lease | None:
        """Forget the lease on ``rid`` (its heap entries go stale and are skipped)."""
        lease = self.by_rid.pop(rid, None)
        if lease is not None:
            owned = self.by_owner.get(lease.owner)
            if owned is not None:
                owned.discard(rid)
                if not owned:
                    del self.by_owner[lease.owner]
        return lease

    def expired(self, now: float) -> set[str]:
        """Resources whose lease, as last read, has expired by ``now``."""
        out: set[str] = set()
        heap = self._expiry
        while heap and heap[0][0] <= now:
            at, rid = heapq.heappop(heap)
            lease = self.by_rid.get(rid)
            if lease is not None and lease.expires_at_s == at:  # else a stale entry
                out.add(rid)
        return out
