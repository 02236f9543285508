"""Score rows in a step: planned into batches the store has room for (`plan_scores`, no
forward), each batch run by one forward with CGEE's per-row exits plus one more for the tails of
multi-token labels (`run_batch`, `treesearch.engine.labels`), then delivered (`deliver`: the
label probabilities read out, each full row's prompt sealed in place). The scheduler
(`treesearch.engine.scheduler`) calls the three in its step."""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Protocol

import torch

from treesearch.backends.protocol import Score
from treesearch.cache.manager import Row
from treesearch.common.stats import Stats
from treesearch.engine.labels import tail_logprobs
from treesearch.engine.plan import ScoreBatch, StepPlan
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
    def let_go(self, row: Row) -> None: ...
    def defer(self, plan: StepPlan, items: list, rows: list[Row]) -> list[int]: ...


# -- planning -------------------------------------------------------------------------------------------
def plan_scores(sched: ScoreQueue, plan: StepPlan) -> None:
    """The step's score rows: grouped by labels and exit rule, each group in batches of up to
    `max_rows` that the store has room for (rows that share a run not yet cached, or that ASKS
    pre-passes, wait a step: `Scheduler.defer`)."""
    groups: dict[Hashable, list[ScoreRow]] = {}
    for it in sched.score_wait:
        groups.setdefault(it.call.key, []).append(it)
    for items in groups.values():
        rule = items[0].call.args["exit_rule"]
        if rule is not None and len({id(it.call) for it in items}) > 1:
            rule = rule.fresh()  # an equivalent rule with no memory of any row (see `Engine.score`)
        for i in range(0, len(items), sched.max_rows):
            part = items[i : i + sched.max_rows]
            if sched.runner.config.shares:
                rows = [it.row for it in part]
                sched.runner.cache.lookup(rows)
                waits = set(sched.defer(plan, part, rows))
                part = [it for k, it in enumerate(part) if k not in waits]
            if part and not _plan_batch(sched, plan, part, rule):
                return


def _plan_batch(sched: ScoreQueue, plan: StepPlan, part: list[ScoreRow], rule: object) -> bool:
    """One batch's segments from the store, all or none: each row's new tokens and the label
    tails' tokens (every row's, as if none were cut short). Refused, a batch is split in halves;
    a single row waits for room that rows holding K/V will give back, or, with none, runs bare
    (its cached context and its own K/V do not fit together), or fails its call. False: a row
    waits."""
    run = sched.runner
    store, shares = run.cache.store, run.config.shares
    rows = [it.row for it in part]
    if shares:
        run.cache.lookup(rows)
    args = part[0].call.args
    tails = len(rows) * sum(len(q) - 1 for q in args["seqs"])
    sizes = [len(r.ids) - r.matched for r in rows] + ([tails] if tails else [])
    segs = store.open_rows(sizes, run.chunk, [*plan.chains(), *(r.chain for r in rows)])
    if segs is None:
        if len(part) > 1:  # too little room for the batch: its halves, one after the other
            h = len(part) // 2
            return _plan_batch(sched, plan, part[:h], rule) and _plan_batch(sched, plan, part[h:], rule)
        busy = sched.rows_held() or plan.holds()
        if not rows[0].bare and shares and not busy:
            rows[0].bare = True  # its cached context and its own K/V do not fit together
            return _plan_batch(sched, plan, part, rule)
        if not busy:
            need = sum(sizes) * store.bytes_per_token + store.missing_bytes([rows[0].chain])
            sched.fail_call(part[0].call, store.no_room(need))
        return False  # waits for the rows holding K/V to give it back
    for r in rows:
        if shares:
            run.cache.pin(r.chain)  # read by this step
            plan.reads.append((r.chain, r.stats))
            sched.let_go(r)
        _stats(r).recomputed_tokens += r.cut
    tail_seg = segs[len(rows)] if tails else None
    plan.scores.append(
        ScoreBatch(part, rows, segs[: len(rows)], tail_seg, args["labels"], args["seqs"], rule)
    )
    return True


# -- running ---------------------------------------------------------------------------------------------
def run_batch(runner: Runner, b: ScoreBatch) -> tuple[list[tuple[torch.Tensor, int]], dict]:
    """The batch's pass, each row's prompt K/V written into its segment (chains resident: the
    runner recomputed them first), then the label tails over it in place. Returns each row's
    (label probabilities, layers run) and the tails' log-probabilities."""
    rows = b.rows
    news = [r.ids[r.matched :] for r in rows]
    out = runner.forward.prefill_into(
        [runner.cache.prefix(r.chain) for r in rows],
        news,
        [r.matched for r in rows],
        [(s.kv, 0) for s in b.segs],
        [_stats(r) for r in rows],
        exit_rule=b.rule,
        exits=RowExits(len(rows)),
        label_ids=[q[0] for q in b.seqs],
    )
    for s, t in zip(b.segs, news):
        s.used = len(t)
    if isinstance(out, RowExits):  # per-row exit: each row has its own depth
        per = [(out.probs[k], out.layers[k]) for k in range(len(rows))]
    else:
        per = [(out[0][k], out[1]) for k in range(len(rows))]
    full = [layers == runner.lm.num_layers for _, layers in per]
    return per, _label_tails(runner, b, full)


def _label_tails(runner: Runner, b: ScoreBatch, full: list[bool]) -> dict[tuple[int, int], float]:
    """(row, label) -> log p of a multi-token label's tokens after its first
    (`treesearch.engine.labels`), for the rows that ran every layer, each over its chain and its
    prompt's new K/V in its open segment (read in place). That forward's own K/V goes to the
    batch's tails segment."""
    rows, segs, seqs = b.rows, b.segs, b.seqs
    multi = [k for k, q in enumerate(seqs) if len(q) > 1]
    who = [(i, k) for i in range(len(rows)) if full[i] for k in multi]
    if not who:
        return {}
    assert b.tails is not None
    lens = [len(seqs[k]) - 1 for _, k in who]
    got = tail_logprobs(
        runner.forward,
        [runner.cache.prefix(rows[i].chain) + [(segs[i].kv, segs[i].used)] for i, _ in who],
        [seqs[k] for _, k in who],
        [len(rows[i].ids) for i, _ in who],
        [_stats(rows[i]) for i, _ in who],
        [(b.tails.kv, sum(lens[:j])) for j in range(len(who))],
    )
    return dict(zip(who, got))


# -- the update ------------------------------------------------------------------------------------------
def deliver(sched: ScoreQueue, b: ScoreBatch, per: list[tuple[torch.Tensor, int]], tails: dict) -> None:
    """A batch's results: each full row's prompt sealed in place (`Runner.seal_prompts`; a row cut
    short by CGEE keeps none), its label probabilities renormalised (whole sequences), its owner
    tagged; each row delivered to its call."""
    run = sched.runner
    rows, labels, seqs = b.rows, b.labels, b.seqs
    full = [layers == run.lm.num_layers for _, layers in per]
    ends = run.seal_prompts(rows, b.segs, full)
    if b.tails is not None:
        run.cache.store.close(b.tails)
    for i, (it, r) in enumerate(zip(b.items, rows)):
        probs, layers_run = per[i]
        if full[i]:  # whole sequences: the first token from this pass, the rest from the tails
            raw = {
                lab: float(probs[q[0]]) * math.exp(tails.get((i, k), 0.0))
                for k, (lab, q) in enumerate(zip(labels, seqs))
            }
        else:
            raw = {lab: float(probs[k]) for k, lab in enumerate(labels)}
        tot = sum(raw.values()) or 1.0
        _stats(r).reused_tokens += r.matched - r.prepass
        run.searches.saw(_stats(r), r.ids)
        res = Score(
            probs={k: v / tot for k, v in raw.items()},
            raw=raw,
            layers_run=layers_run,
            reused_tokens=r.matched - r.prepass,
            handle=ends[i],
            asks_sigma=r.asks_sigma,
            asks_ref=r.asks_ref,
        )
        if it.owner is not None and res.handle is not None:
            run.cache.tag_owners([res.handle], [it.owner])
        sched.score_wait.remove(it)
        it.call.deliver(it.index, res)
        sched.maybe_done(it.call)


def run_scores(sched: ScoreQueue) -> None:
    """The waiting score rows alone, as a step of their own: planned, run, delivered (a
    scheduler's step does the same inside its one plan)."""
    plan = StepPlan()
    run = sched.runner
    try:
        plan_scores(sched, plan)
        run.recompute(plan)
        for b in plan.scores:
            deliver(sched, b, *run_batch(run, b))
    finally:
        for b in plan.scores:
            for s in [*b.segs, b.tails]:
                if s is not None and s.id in run.cache.store.open_segments:
                    run.cache.store.close(s)
        run.cache.end_call()
