"""Shared runs: new-token runs that several rows of a batch start with (a few-shot template's tail
that the cache does not hold yet). Finding them is planning, done here on looked-up rows; the
engine computes each once (`treesearch.engine.runner.share_runs`) and every row then reuses it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from treesearch.cache.segment import Chain


@dataclass
class SharedRun:
    """A run of new tokens several rows start with, after the cached chain of its first row."""

    first: Any  # the row that computes it (`treesearch.cache.manager.Row`; it does not reuse the run)
    chain: Chain  # what the run attends over
    new: list[int]  # the run's tokens
    start: int  # its absolute position
    ids: list[int]  # the context it ends: the first row's ids up to the run's end
    charge: Any  # the `Stats` its work is counted in (the first row's)


def find_shared_runs(rows: list, min_tokens: int, default_stats: Any) -> list[SharedRun]:
    """Runs of at least min_tokens new tokens that two or more looked-up rows share after the same
    cached chain end (a bare row attends over no cached prefix and takes none)."""
    groups: dict[tuple, list] = {}
    for r in rows:
        if not r.bare and r.matched < len(r.ids) - 1:
            end = (r.chain[-1][0].id, r.chain[-1][1]) if r.chain else (0, 0)
            groups.setdefault((end, r.ids[r.matched]), []).append(r)
    runs = []
    for members in groups.values():
        if len(members) < 2:
            continue
        first = members[0]
        n = min(len(m.ids) - 1 - m.matched for m in members)
        lcp = 0
        while lcp < n and all(m.ids[m.matched + lcp] == first.ids[first.matched + lcp] for m in members):
            lcp += 1
        if lcp >= min_tokens:
            lo = first.matched
            runs.append(
                SharedRun(
                    first,
                    first.chain,
                    first.ids[lo : lo + lcp],
                    lo,
                    first.ids[: lo + lcp],
                    first.stats or default_stats,
                )
            )
    return runs
