"""One batch of score rows: label probabilities after each prompt, in one forward (with CGEE's
per-row exits) plus one more for the tails of multi-token labels (`treesearch.engine.labels`).
The scheduler (`treesearch.engine.scheduler`) runs it for the score rows of a step."""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any, Protocol

from treesearch.backends.protocol import Score
from treesearch.cache.manager import CacheManager, Row, bare_copy
from treesearch.common.errors import CacheBudgetError
from treesearch.common.stats import Stats
from treesearch.engine.labels import label_tails
from treesearch.engine.runner import Runner
from treesearch.engine.running import Call, ScoreRow
from treesearch.policies.cgee import RowExits


def _stats(r: Row) -> Stats:
    assert r.stats is not None  # the engine's rows always carry their search's Stats
    return r.stats


class ScoreQueue(Protocol):
    """The scheduler as a step's scoring sees it: the waiting score rows and how calls end."""

    runner: Runner
    score_wait: list[ScoreRow]
    max_rows: int

    def rows_held(self) -> int: ...
    def fail_call(self, call: Call, exc: BaseException) -> None: ...
    def maybe_done(self, call: Call) -> None: ...


def score_batch(
    runner: Runner,
    rows: list[Row],
    labels: list[str],
    seqs: list[list[int]],
    owners: list | None,
    exit_rule: Any,
) -> list[Score]:
    """Score rows (looked up): prepare and hold their chains, run the pass, store each full row's
    prompt K/V and tag its owner."""
    runner.prepare(rows)
    news = [r.ids[r.matched :] for r in rows]
    held: list[int] = []
    try:
        batch, out = runner.prefill_rows(
            [r.chain for r in rows],
            news,
            [r.matched for r in rows],
            [_stats(r) for r in rows],
            held=held,
            want_logits=True,
            exit_rule=exit_rule,
            exits=RowExits(len(rows)),
            label_ids=[q[0] for q in seqs],
        )
        for r in rows:
            _stats(r).reused_tokens += r.matched - r.prepass
        if isinstance(out, RowExits):  # per-row exit: each row has its own depth and batch row
            per = [(out.probs[b], out.layers[b], out.batch_row[b]) for b in range(len(rows))]
        else:
            per = [(out[0][b], out[1], b) for b in range(len(rows))]
        full = [layers == runner.lm.num_layers for _, layers, _ in per]
        tails = label_tails(runner.forward, runner.cache, rows, batch, per, full, seqs, held)
        ends = runner.store_prompts(rows, batch, [len(t) for t in news], full, [p[2] for p in per])
    finally:
        for n in held:
            runner.cache.unreserve(n)
    results = []
    for b, r in enumerate(rows):
        probs, layers_run, _ = per[b]
        if full[b]:  # whole sequences: the first token from this pass, the rest from the tails
            raw = {
                lab: float(probs[q[0]]) * math.exp(tails.get((b, k), 0.0))
                for k, (lab, q) in enumerate(zip(labels, seqs))
            }
        else:
            raw = {lab: float(probs[k]) for k, lab in enumerate(labels)}
        tot = sum(raw.values()) or 1.0
        runner.searches.saw(_stats(r), r.ids)
        results.append(
            Score(
                probs={k: v / tot for k, v in raw.items()},
                raw=raw,
                layers_run=layers_run,
                reused_tokens=r.matched - r.prepass,
                handle=ends[b],
                asks_sigma=r.asks_sigma,
                asks_ref=r.asks_ref,
            )
        )
    if owners is not None:
        runner.cache.tag_owners([s.handle for s in results], owners)
    return results


def plan_batches(cache: CacheManager, rows: list[Row], extra: int, max_batch: int) -> list[list[int]]:
    """Split the rows (in order) into batches of at most max_batch whose K/V fits the budget
    together with every row whose prompt must stay cached (`need_bytes`); without a budget,
    batches of max_batch."""
    must = [r for r in rows if r.must_store]
    budget = cache.store.budget
    for r in rows:  # a row whose cached context and buffer cannot fit together runs bare
        if budget is not None and cache.need_bytes([r], extra, must) > budget >= cache.need_bytes(
            [bare_copy(r)], extra, must
        ):
            r.bare, r.chain, r.matched = True, [], 0
    out: list[list[int]] = []
    cur: list[int] = []
    for i, r in enumerate(rows):
        if cur and (
            len(cur) == max_batch
            or (
                cache.store.budget is not None
                and cache.need_bytes([rows[j] for j in cur] + [r], extra, must) > cache.store.budget
            )
        ):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def fits_beside_running(cache: CacheManager, part: list[Row], rows: list[Row]) -> bool:
    """Whether a score batch's K/V fits now beside the running rows' reserved buffers: without
    this check a batch that cannot fit would first recompute its evicted context (a template
    shared by every score prompt) and only then fail on its own buffer, again every step while
    the rows run. rows: the whole group (its must-store rows count as in `plan_batches`). The
    store answers, for what the batch reads and adds."""
    chains, add = cache.batch_bytes(part, 0, [r for r in rows if r.must_store])
    return cache.store.fits(add, chains)


def run_scores(sched: ScoreQueue) -> None:
    """The step's score rows: grouped by labels and exit rule, each group in batches that fit."""
    groups: dict[Hashable, list[ScoreRow]] = {}
    for it in sched.score_wait:
        groups.setdefault(it.call.key, []).append(it)
    for items in groups.values():
        if not _score_group(sched, items):
            return


def _score_group(sched: ScoreQueue, items: list[ScoreRow]) -> bool:
    """Score the rows of calls with one key in batches that fit; False when one must wait."""
    run = sched.runner
    args = items[0].call.args
    rule = args["exit_rule"]
    if rule is not None and len({id(it.call) for it in items}) > 1:
        rule = rule.fresh()  # an equivalent rule with no memory of any row (see `Engine.score`)
    rows = [it.row for it in items]
    if run.config.shares:
        run.cache.lookup(rows)
    for idx in plan_batches(run.cache, rows, 0, sched.max_rows):
        part = [items[i] for i in idx]
        if sched.rows_held() and not fits_beside_running(run.cache, [p.row for p in part], rows):
            return False  # waits for running rows to finish, before recomputing any of its context
        try:
            out = score_batch(
                run, [p.row for p in part], args["labels"], args["seqs"], [p.owner for p in part], rule
            )
        except CacheBudgetError as exc:
            run.cache.end_call(part[0].stats)
            if len(part) > 1:  # too little room for the batch: its halves, one after the other
                h = len(part) // 2
                return _score_group(sched, part[:h]) and _score_group(sched, part[h:])
            if not part[0].row.bare and run.config.shares and not sched.rows_held():
                part[0].row.bare = True  # its cached context and its buffer do not fit together
                return _score_group(sched, part)
            if sched.rows_held():
                return False  # waits for running rows to finish
            sched.fail_call(part[0].call, exc)
            return False
        run.cache.end_call(part[0].stats)
        for p, res in zip(part, out):
            ref = res.asks_ref
            res.asks_ref = None if ref is None or part[ref].call is not p.call else part[ref].index
            sched.score_wait.remove(p)
            p.call.deliver(p.index, res)
            sched.maybe_done(p.call)
    return True
