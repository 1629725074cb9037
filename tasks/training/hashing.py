"""Hashing checkpoint bytes while they are written, and files after the fact.

Every committed checkpoint's manifest carries each file's sha256; computing it must not
cost a second pass over the bytes (torch.save's writes are hashed on their way out).
"""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# Chunks at least this big are hashed on a helper thread while the caller writes them:
# hashlib and file writes both release the GIL, so hashing costs (almost) no wall time.
_OVERLAP_MIN_BYTES = 1 << 20

_HASH_POOL: ThreadPoolExecutor | None = None
_HASH_POOL_LOCK = threading.Lock()


def hash_pool() -> ThreadPoolExecutor:
    """One small pool for the whole process (not one per manager: no thread leak)."""
    global _HASH_POOL
    with _HASH_POOL_LOCK:
        if _HASH_POOL is None:
            _HASH_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ckpt-hash")
        return _HASH_POOL


class HashingWriter:
    """File-like sink for torch.save: hashes and counts every byte on its way out."""

    def __init__(self, target: Any, pool: ThreadPoolExecutor) -> None:
        self._target = target
        self._pool = pool
        self.sha256 = hashlib.sha256()
        self.size_bytes = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        size = view.nbytes
        if size >= _OVERLAP_MIN_BYTES:
            hashing = self._pool.submit(self.sha256.update, view)
            try:
                _write_fully(self._target, view)
            finally:
                hashing.result()
        else:
            self.sha256.update(view)
            _write_fully(self._target, view)
        self.size_bytes += size
        return size

    def flush(self) -> None:
        self._target.flush()


def _write_fully(target: Any, view: memoryview) -> None:
    # Raw (unbuffered) files may write less than asked.
    while view.nbytes:
        written = target.write(view)
        if written is None:  # buffered writers that return nothing wrote everything
            return
        view = view[written:]


def sha256_of(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
