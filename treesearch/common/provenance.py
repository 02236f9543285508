"""When, on which code and under what load a measurement ran: the caption a report carries.

Recorded by `treesearch bench` (every workload and `bench claims`) and `treesearch run --json`, read
by the benchmark pages of the documentation (`treesearch.cli.docs`)."""

from __future__ import annotations

import datetime
import os
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2]  # the checkout treesearch runs from (a git work tree or not)


def commit(root: Path = SOURCE) -> str | None:
    """The short hash of the checkout's HEAD, with `+` when tracked files differ from it; None
    outside a git work tree (an installed wheel) or without git."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=9", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+" if dirty else "")


def record() -> dict:
    """{"date": UTC date and time, "commit": see `commit`, "load": 1-minute load average at the start}."""
    try:
        load: float | None = round(os.getloadavg()[0], 2)
    except OSError:  # not on this platform
        load = None
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return {"date": now, "commit": commit(), "load": load}
