"""Rank 0's steps, back in the process that launched the gang.

The launching process's step observers (tasks.training.control.step_observers: the CLI's
progress bar, a test's step gate) never see a gang's steps: those run in the rank
processes torchelastic's agent spawned. A ``StepRelay`` listens on loopback
(multiprocessing.connection, with a random key that travels to the ranks through the
agent's spawn pipe, never a command line); rank 0 connects once per round of the gang (a
restarted round connects again) and sends each StepInfo; a thread here hands it to the
observers. A relay that falls behind or breaks never slows or stops training: rank 0's
send is a small local write, and a failed one is dropped.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Sequence
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

log = logging.getLogger(__name__)

Observer = Callable[[str, int, Any], None]  # (job id, total steps, StepInfo)
RelayAddress = tuple[tuple[str, int], bytes]  # (host, port), key


class StepRelay:
    """Forwards rank 0's StepInfos to ``observers`` while open (a context manager)."""

    def __init__(self, job_id: str, total_steps: int, observers: Sequence[Observer]) -> None:
        self.job_id, self.total_steps, self.observers = job_id, total_steps, list(observers)
        self._key = secrets.token_bytes(16)
        self._listener = Listener(("127.0.0.1", 0), authkey=self._key)
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(
            target=self._accept, name="gpuflow-step-relay", daemon=True
        )

    @property
    def address(self) -> RelayAddress:
        host, port = self._listener.address
        return (str(host), int(port)), self._key

    def __enter__(self) -> StepRelay:
        self._acceptor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting; wait a little for what rank 0 already sent."""
        self._closed.set()
        self._listener.close()  # the accept loop ends with an OSError
        for thread in self._threads:
            thread.join(timeout=5.0)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn = self._listener.accept()
            except (OSError, EOFError):
                return  # closed, or a client that failed the key check
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: Connection) -> None:
        with conn:
            while True:
                try:
                    info = conn.recv()  # a StepInfo (pickled: the key authenticated it)
                except (EOFError, OSError):
                    return  # the round ended (or its rank 0 died)
                for observer in self.observers:
                    try:
                        observer(self.job_id, self.total_steps, info)
                    except Exception:  # noqa: BLE001 - an observer never stops the relay
                        log.exception("step observer %r failed on step %d", observer, info.step)


def relay_hook(address: RelayAddress | None) -> Callable[[Any], None] | None:
    """Rank 0's step hook that sends each StepInfo to the launcher's relay (None: none)."""
    if address is None:
        return None
    where, key = address
    try:
        conn = Client(where, authkey=key)
    except OSError as exc:
        log.warning("no step relay at %s (%s): the launcher sees no progress", where, exc)
        return None

    def send(info: Any) -> None:
        nonlocal conn
        if conn is None:
            return
        try:
            conn.send(info)
        except OSError:
            conn = None  # the launcher stopped listening: train on

    return send
