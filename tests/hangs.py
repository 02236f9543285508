"""Tests of code that used to hang: run it in a thread and tell a hang from an ending."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def finishes(fn: Callable[[], Any], timeout: float = 120.0) -> list:
    """Run fn in a thread: [its result or exception] if it ends within timeout, else [] (a hang)."""
    out: list = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    return out
