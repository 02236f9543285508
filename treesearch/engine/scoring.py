"""One batch of score rows: label probabilities after each prompt, in one forward (with CGEE's
per-row exits) plus one more for the tails of multi-token labels (`treesearch.engine.labels`).
The scheduler (`treesearch.engine.scheduler`) runs it for the score rows of a step."""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any, Protocol

from treesearch.backends.protocol import Score
from treesearch.cache.kvstore import Segment
from treesearch.cache.manager import Row
from treesearch.common.errors import CacheBudgetError
from treesearch.common.stats import Stats
from treesearch.engine.labels import tail_logprobs
from treesearch.engine.runner import Runner, hold_rows
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
    """Score rows: plan them, open a segment in the store for each row's new tokens (the store
    answers whether they fit, CacheBudgetError if not, before any forward), pin and make resident
    their chains, run the pass writing each prompt's K/V into its segment, read the label tails
    over it in place, then seal each full row's segment into the tree where it is (a row cut short
    by CGEE closes its own) and tag its owner."""
    runner.plan_rows(rows)
    segs = runner.open_segments([len(r.ids) - r.matched for r in rows], [r.chain for r in rows])
    store = runner.cache.store
    try:
        if runner.config.shares:
            hold_rows(runner.cache, runner.compute, rows)
        news = [r.ids[r.matched :] for r in rows]
        out = runner.forward.prefill_into(
            [runner.cache.prefix(r.chain) for r in rows],
            news,
            [r.matched for r in rows],
            [(s.kv, 0) for s in segs],
            [_stats(r) for r in rows],
            exit_rule=exit_rule,
            exits=RowExits(len(rows)),
            label_ids=[q[0] for q in seqs],
        )
        for s, t in zip(segs, news):
            s.used = len(t)
        for r in rows:
            _stats(r).reused_tokens += r.matched - r.prepass
        if isinstance(out, RowExits):  # per-row exit: each row has its own depth
            per = [(out.probs[b], out.layers[b]) for b in range(len(rows))]
        else:
            per = [(out[0][b], out[1]) for b in range(len(rows))]
        full = [layers == runner.lm.num_layers for _, layers in per]
        tails = _label_tails(runner, rows, segs, full, seqs)
        ends = runner.seal_prompts(rows, segs, full)
    finally:
        for s in segs:
            if s.id in store.open_segments:
                store.close(s)
    results = []
    for b, r in enumerate(rows):
        probs, layers_run = per[b]
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


def _label_tails(
    runner: Runner, rows: list[Row], segs: list[Segment], full: list[bool], seqs: list[list[int]]
) -> dict[tuple[int, int], float]:
    """(row, label) -> log p of a multi-token label's tokens after its first
    (`treesearch.engine.labels`), for the rows that ran every layer, each over its chain and its
    prompt's new K/V in its open segment (read in place). That forward's own K/V goes to one more
    open segment, closed when it is done."""
    multi = [k for k, q in enumerate(seqs) if len(q) > 1]
    who = [(b, k) for b in range(len(rows)) if full[b] for k in multi]
    if not who:
        return {}
    store = runner.cache.store
    lens = [len(seqs[k]) - 1 for _, k in who]
    (own,) = runner.open_segments([sum(lens)], [])
    try:
        got = tail_logprobs(
            runner.forward,
            [runner.cache.prefix(rows[b].chain) + [(segs[b].kv, segs[b].used)] for b, _ in who],
            [seqs[k] for _, k in who],
            [len(rows[b].ids) for b, _ in who],
            [_stats(rows[b]) for b, _ in who],
            [(own.kv, sum(lens[:i])) for i in range(len(who))],
        )
    finally:
        store.close(own)
    return dict(zip(who, got))


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
    for i in range(0, len(items), sched.max_rows):
        part = items[i : i + sched.max_rows]
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
                part[0].row.bare = True  # its cached context and its own K/V do not fit together
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
