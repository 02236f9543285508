"""Shared runs: new-token runs that several rows of a batch start with (a few-shot template's tail
that the cache does not hold yet) are computed once, stored, and every row then reuses them."""

from __future__ import annotations

from typing import Any

from treesearch.common.errors import CacheBudgetError


def _ceil(n: int, d: int) -> int:
    return -(-n // d)


def share_runs(cache: Any, rows: list) -> None:
    """Compute once the new-token runs that several rows share, then look the rows up again. It
    saves work and is never needed: where the budget has no room for the runs' blocks and their
    forward's buffer (beside what running rows hold), each row computes its own. A bare row
    attends over no cached prefix, so it takes no shared run (a lookup leaves it at none)."""
    while True:
        groups: dict[tuple, list] = {}
        for r in rows:
            if not r.bare and r.matched < len(r.ids) - 1:
                end = (r.chain[-1][0].id, r.chain[-1][1]) if r.chain else (0, 0)
                groups.setdefault((end, r.ids[r.matched]), []).append(r)
        runs: list[tuple[Any, list[int], int, list[int], Any]] = []  # counted in the first row's stats
        firsts: list[tuple[Any, int]] = []
        for members in groups.values():
            if len(members) < 2:
                continue
            first = members[0]
            n = min(len(m.ids) - 1 - m.matched for m in members)
            lcp = 0
            while lcp < n and all(m.ids[m.matched + lcp] == first.ids[first.matched + lcp] for m in members):
                lcp += 1
            if lcp >= cache.share_min_tokens:
                runs.append(
                    (
                        first.chain,
                        first.ids[first.matched : first.matched + lcp],
                        first.matched,
                        first.ids[: first.matched + lcp],
                        first.stats or cache.stats,
                    )
                )
                firsts.append((first, lcp))
        if not runs:
            return
        for run in runs:
            cache.pin(run[0])
        store = cache.store
        need = sum(_ceil(len(run[1]), store.block_size) for run in runs) * store.block_bytes
        buffer = len(runs) * max(len(run[1]) for run in runs) * store.bytes_per_token  # the forward's
        if not store.can_hold(need + buffer):  # no room for the shared runs: each row computes its own
            return
        try:
            for run in runs:
                cache.ensure_resident(run[0], charge=run[4])
            kvs = cache.compute(
                [r[0] for r in runs], [r[1] for r in runs], [r[2] for r in runs], [r[4] for r in runs]
            )
        except CacheBudgetError:  # no room after all (making the contexts resident took it)
            return
        for kv, (_, _, start, ids, charge) in zip(kvs, runs):
            cache.insert(ids, start, kv, charge=charge)
        cache.lookup(rows)
        for first, lcp in firsts:  # the row that computed a shared run did not reuse it
            first.prepass += lcp
