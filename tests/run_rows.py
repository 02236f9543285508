"""Rows of a `treesearch run` results file, read and reduced to what must not depend on the cache
(shared by the run and distributed tests)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

# `treesearch run` on Game of 24 with the tiny model, one thread, no progress bar
RUN = [
    sys.executable,
    "-m",
    "treesearch.cli.main",
    "run",
    "game24",
    "--model",
    "tiny",
    "--no-progress",
    "--threads",
    "1",
]
SAME = ("index", "input", "status", "answer", "solved", "answer_node", "error")
OWN_WORK = ("decode_tokens", "generated_tokens", "unique_tokens")


def lines(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def comparable(rows: list[dict]) -> list[tuple]:
    """What a row says regardless of what the cache held: the result and the search's own work."""
    return [tuple(r[k] for k in SAME) + tuple(r["stats"].get(k) for k in OWN_WORK) for r in rows]
