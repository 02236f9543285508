"""Shared runs: new-token runs that several rows of a batch start with (a few-shot template's tail
that the cache does not hold yet). Planning only: the first row of such a group computes the run
as part of its own prompt, and the others wait until its prompt is in, then find it cached (the scheduler,
`treesearch.engine.scheduler`). No forward of its own, no room of its own."""

from __future__ import annotations


def shared_run_followers(rows: list, min_tokens: int) -> dict[int, int]:
    """The looked-up rows that start, after the same cached chain end, with a run of at least
    min_tokens new tokens an earlier row of the batch starts with (a bare row attends over no
    cached prefix and shares none): index -> the index of that earlier row, its group's first,
    which computes the run while these wait."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        if not r.bare and r.matched < len(r.ids) - 1:
            end = (r.chain[-1][0].id, r.chain[-1][1]) if r.chain else (0, 0)
            groups.setdefault((end, r.ids[r.matched]), []).append(i)
    out: dict[int, int] = {}
    for members in groups.values():
        first = rows[members[0]]
        for i in members[1:]:
            r = rows[i]
            n = min(len(r.ids) - 1 - r.matched, len(first.ids) - 1 - first.matched)
            lcp = 0
            while lcp < n and r.ids[r.matched + lcp] == first.ids[first.matched + lcp]:
                lcp += 1
            if lcp >= min_tokens:
                out[i] = members[0]
    return dict(sorted(out.items()))
