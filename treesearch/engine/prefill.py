"""Admission and chunked prefill of generate rows: a step's part of `treesearch.engine.scheduler`.

Each step prefills at most `step_tokens` uncached prompt tokens: first the next part of every row
whose prompt is not fully in yet (`Scheduler.filling`, oldest first), then waiting rows admitted in
arrival order (preempted rows first) into what is left. So a long prompt is prefilled over several
steps, each beside the running rows' decode, and no decode step waits long for it.
A row's K/V is reserved when it is admitted (`RowMemory.hold`: its whole uncached context, its
first decode chunk and its step token), so a partly prefilled row always has room for its next
part. The rows of one step's forward (a cohort) share one buffer, padded to the longest part; the
padding is reserved with the cohort, and a row whose padding does not fit waits a step (a cohort's
first row needs none, so every step with rows to fill prefills some). A part attends over the
row's chain and its earlier parts, read in place; a row whose prompt is fully in stores its prompt
K/V, samples its first token and decodes from that step on. Results never depend on the parts
(rows carry their own samplers; `tests/engine/test_chunked_prefill.py`).
"""

from __future__ import annotations

from typing import Any

import torch

from treesearch.cache.manager import Row
from treesearch.common.errors import CacheBudgetError
from treesearch.engine.pins import loosen_pins, must_store
from treesearch.engine.running import Cohort, GenRow


def fill(sched: Any) -> tuple[list[GenRow], list[GenRow], torch.Tensor | None]:
    """Admit waiting rows into this step's token budget and prefill one part of every row that
    fits; returns (rows whose prompt is now fully in, those of them that sample a first token,
    their logits)."""
    left = sched.step_tokens - sum(g.todo() for g in sched.filling)
    if sched.gen_wait and left > 0 and not (sched.backoff and sched.running):
        admit(sched, left)  # after a preemption, rows wait for a running row to finish (no thrash)
    return prefill_parts(sched)


def admit(sched: Any, left: int) -> None:
    """Waiting rows, in order, while `left` prompt tokens remain this step and `max_rows` allow:
    planned together (`Engine.plan_rows`), then held one by one (`RowMemory.hold`) until one does
    not fit; they join `sched.filling`. A row that cannot fit with nothing else holding K/V
    (`hold_alone`) lets go of planning's pins, then runs without its cached prefix (bare), or, if
    even that cannot fit, fails its call."""
    eng = sched.engine
    picked: list[GenRow] = []
    est = 0
    while sched.gen_wait and est < left and sched.rows_held() + len(picked) < sched.max_rows:
        g = sched.gen_wait.popleft()
        est += len(g.context) - (1 if g.gens else 0) - g.row.matched  # uncached when it was submitted
        picked.append(g)
    plans = []
    cache = eng.cache
    for g in picked:
        ids = g.row.ids + g.gens[:-1]  # a resumed row computes its fed tokens again
        keep = must_store(cache, g.row, g.owner) and not g.gens
        plans.append(Row(ids=ids, stats=g.stats, search=g.row.search, must_store=keep))
        plans[-1].bare = g.row.bare
    no_room: CacheBudgetError | None = None
    try:
        eng.plan_rows(plans)
    except CacheBudgetError as exc:  # planning's own forwards (ASKS) found no room: all wait
        no_room = exc
    admitted: list[GenRow] = []
    for g, p in zip(picked, plans):
        if left <= 0 or no_room is not None:
            break
        ok = sched.memory.hold(g, p)
        if not ok and not admitted and not sched.rows_held():
            ok = hold_alone(sched, g, p)
        if not ok:
            break
        left -= len(p.ids) - p.matched
        g.order = sched.next_order()
        g.stats.recomputed_tokens += p.cut
        if not g.reused:
            g.asks_sigma = p.asks_sigma
            ref = None if p.asks_ref is None else picked[p.asks_ref]
            g.asks_ref = None if ref is None or ref.call is not g.call else ref.index
        admitted.append(g)
    for g in reversed(picked[len(admitted) :]):
        sched.gen_wait.appendleft(g)
    if not admitted and picked and not sched.rows_held():  # nothing holds room that could free: never fits
        sched.fail_call(picked[0].call, no_room or sched.memory.no_room(picked[0]))
    sched.filling.extend(admitted)


def hold_alone(sched: Any, g: GenRow, p: Row) -> bool:
    """The first row to admit did not fit, and no admitted row holds K/V: before its call fails,
    let go of what planning pinned for this step (the shared runs it stored, which no row holds
    yet: they may be evicted and recomputed) and, on an engine that searches share, the root
    prompts' pins (`treesearch.engine.pins`), then, with sharing on, try the row without its cached
    prefix (bare: too little room for that context and its buffer)."""
    cache = sched.engine.cache
    cache.end_call(g.stats)
    if sched.memory.hold(g, p):
        return True
    if loosen_pins(sched.engine) and sched.memory.hold(g, p):
        return True
    if not sched.engine.config.shares or p.bare:
        return False
    p.bare, g.row.bare = True, True
    cache.lookup([p])
    return bool(sched.memory.hold(g, p))


def prefill_parts(sched: Any) -> tuple[list[GenRow], list[GenRow], torch.Tensor | None]:
    """One forward: the next part of each filling row (oldest first) within `step_tokens` whose
    share of the cohort's padding fits the budget; then the rows whose prompt is fully in."""
    eng, cache = sched.engine, sched.engine.cache
    bpt = cache.store.bytes_per_token
    left = sched.step_tokens
    rows: list[GenRow] = []
    parts: list[int] = []
    pad = 0  # tokens of padding in the cohort's buffer: rows x longest part - the parts
    for g in sched.filling:
        if left <= 0:
            break
        n = min(g.todo(), left)
        grown = (len(rows) + 1) * max([n, *parts]) - sum(parts) - n
        if grown > pad:
            try:
                cache.reserve((grown - pad) * bpt)
            except CacheBudgetError:
                continue  # its part waits a step: rows that finish or fill give back room
            pad = grown
        rows.append(g)
        parts.append(n)
        left -= n
    if not rows:
        return [], [], None
    plans: list[Row] = [g.plan for g in rows]  # type: ignore[misc]
    starts = [p.matched + g.filled for g, p in zip(rows, plans)]
    try:
        batch, logits = eng.forward.prefill(
            [cache.prefix(p.chain) + g.own_runs() for g, p in zip(rows, plans)],
            [p.ids[s : s + n] for p, s, n in zip(plans, starts, parts)],
            starts,
            extra=0,
            want_logits=True,
            charge=[g.stats for g in rows],
        )
    except BaseException:
        cache.unreserve(pad * bpt)
        raise
    cohort = Cohort(batch, (sum(parts) + pad) * bpt, len(rows))
    done, fresh = [], []
    for b, (g, n) in enumerate(zip(rows, parts)):
        g.parts.append((cohort, b, n))
        g.filled += n
        g.fill_bytes -= n * bpt  # those bytes are the cohort's now
        if g.todo() == 0:
            done.append(g)
            if prompt_in(sched, g):
                fresh.append(b)
    for g in done:
        sched.filling.remove(g)
    return done, [rows[b] for b in fresh], logits[fresh] if fresh else logits[:0]


def prompt_in(sched: Any, g: GenRow) -> bool:
    """A row's context is fully prefilled: count its reuse (first admission) or its recomputation
    (a preempted row's), store its new prompt K/V; True when it samples its first token now."""
    p = g.plan
    assert p is not None
    if g.reused:  # a preempted row: all it computed now it had computed before
        g.stats.recomputed_tokens += len(p.ids) - p.matched
        return False
    g.reused, g.reused_n = True, p.matched - p.prepass
    g.stats.reused_tokens += g.reused_n
    if sched.engine.config.shares:
        g.handle = sched.memory.store_prompt(p, g.prompt_kv(), g.owner)
    return True
