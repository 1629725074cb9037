"""The waiting jobs: one ordered queue, counted per pool so each pool's depth is bounded.

Order is priority (highest first), then submission order; the FIFO baseline ignores
priority. A preempted job keeps its original sequence number, so it goes back to where
it stood rather than to the end. The bound is enforced at submission only (``room``): a
re-queued victim was admitted once and must never be dropped.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Iterator


class JobQueue:
    def __init__(self, fifo: bool = False) -> None:
        self.fifo = fifo
        self._keys: list[tuple[int, int, str]] = []
        self._key_of: dict[str, tuple[int, int, str]] = {}
        self._pool_of: dict[str, str] = {}
        self._per_pool: Counter[str] = Counter()

    def _key(self, job_id: str, priority: int, seq: int) -> tuple[int, int, str]:
        return (0 if self.fifo else -priority, seq, job_id)

    def add(self, job_id: str, priority: int, seq: int, pool: str) -> None:
        if job_id in self._key_of:
            raise ValueError(f"job {job_id!r} is queued already")
        key = self._key(job_id, priority, seq)
        insort(self._keys, key)
        self._key_of[job_id] = key
        self._pool_of[job_id] = pool
        self._per_pool[pool] += 1

    def remove(self, job_id: str) -> bool:
        key = self._key_of.pop(job_id, None)
        if key is None:
            return False
        i = bisect_left(self._keys, key)
        del self._keys[i]
        pool = self._pool_of.pop(job_id)
        self._per_pool[pool] -= 1
        return True

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._key_of

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[str]:
        """Job ids in order; a snapshot, so the queue may change while it is walked."""
        return iter([k[2] for k in self._keys])

    def waiting(self, pool: str) -> int:
        return self._per_pool[pool]

    def position(self, job_id: str) -> int:
        """0-based place in the queue."""
        return bisect_left(self._keys, self._key_of[job_id])

    def pools(self) -> dict[str, int]:
        return {p: n for p, n in self._per_pool.items() if n}
