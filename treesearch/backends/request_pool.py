"""`RequestPool`: a function over items on at most `size` threads at once, in order, the first
failure raised (the server engine's concurrent requests, so that the server can batch them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class RequestPool:
    """Threads started on first use; one item, or size 1, runs in the caller's thread."""

    def __init__(self, size: int, name: str = "treesearch-server") -> None:
        self.size = size
        self.name = name
        self._pool: ThreadPoolExecutor | None = None

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """fn over items, concurrently (order kept); the first failure is raised, the rest cancelled."""
        if len(items) == 1 or self.size == 1:
            return [fn(x) for x in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.size, thread_name_prefix=self.name)
        futures = [self._pool.submit(fn, x) for x in items]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise

    def close(self) -> None:
        """Stop the threads, cancelling what has not started (the pool restarts on the next map)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
