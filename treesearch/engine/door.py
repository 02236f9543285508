"""The engine's lock, with a fair step boundary: threads that want it between steps go first.

Why: a step runs under the engine's lock, and every search thread needs that lock between steps
(to prepare and queue its next call, and to return from its last). A plain lock lets the thread
that runs the steps take it back at once after each step, before the woken threads get to it, so
searches whose calls had returned kept missing steps: on Game of 24 with 64 searches in flight
only 4-8 rows ran a step for the first 300 steps while the other searches waited for the lock.
Here every thread counts itself in before it takes the lock (`Door.__enter__`), and the thread
about to run a step waits while any are counted in (`Door.wait_turns`), woken by the last of them
to take the lock (`Door.passed`). There is still no barrier
over searches: a thread running its own search logic is not counted and does not hold up a step.
"""

from __future__ import annotations

import threading
from typing import Any


class Door:
    """A reentrant lock (`with door:`) that counts the threads waiting to take it, so the stepping
    thread can let them in first; `cond()` makes a condition on the same lock."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._count = threading.Lock()
        self._turns = threading.Condition(self._lock)  # the stepping thread waits here for its turn
        self.waiting = 0  # threads counted in: waiting for the lock, or woken and about to take it

    def cond(self) -> threading.Condition:
        """A condition variable over this lock (its wait() releases the lock while waiting)."""
        return threading.Condition(self._lock)

    def count_in(self, n: int = 1) -> None:
        """n more threads will take the lock soon (a woken waiter is counted by whoever wakes it)."""
        with self._count:
            self.waiting += n

    def passed(self) -> None:
        """A counted-in thread now holds the lock: count it out, and when it was the last, tell
        the stepping thread, which runs its step once this thread lets the lock go."""
        self.count_in(-1)
        if self.waiting == 0:
            self._turns.notify()

    def __enter__(self) -> Door:
        self.count_in()
        try:
            self._lock.acquire()
        except BaseException:
            self.count_in(-1)
            raise
        self.passed()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()

    def wait_turns(self, cond: threading.Condition | None = None, poll_s: float = 0.005) -> None:
        """Held by the thread about to run a step: release the lock until no thread is counted in
        (each takes it, does its between-steps work and lets it go). The last one in wakes it
        (`passed`); poll_s only bounds a wake-up missed (a test's own cond gets none)."""
        cond = self._turns if cond is None else cond
        while self.waiting > 0:
            cond.wait(poll_s)
