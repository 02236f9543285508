"""The iteration-level scheduler of the local engine: every search's calls become rows of one
running batch, advanced a step at a time (continuous batching, as vLLM's and SGLang's schedulers).

The engine's lock is a `treesearch.engine.door.Door`: a thread that asks for it while a step runs
(to prepare or queue its next call, or to return from one that ended) gets it before the next
step, so a search's next call joins the very next step; a thread waiting for its call sleeps on
the call's own condition, woken when the call ends (or to run the steps, when the thread running
them leaves).

One step (under the engine's lock, run by whichever waiting thread finds no step running) is
decided first, then run: `schedule` makes a `treesearch.engine.plan.StepPlan` and runs no
forward; every byte the plan's forwards write is allocated from the store while it is made
(`KVStore.open_rows`, all or none); the runner (`treesearch.engine.runner.Runner`) executes it and
this class applies what came out.
1. schedule: every running row whose decode chunks are full grown (`RowMemory.regrow`: copied
   into one a block bigger; else one more block; when even that cannot fit, the admitted row of
   lowest omega, LRU: the latest admitted, is preempted: its K/V freed, requeued first,
   recomputed when readmitted, its tokens and sampler kept); score rows in batches the store has
   room for (`treesearch.engine.scoring`); waiting generate rows admitted in arrival order
   (preempted rows first), up to `max_rows` admitted and within `step_tokens` uncached prompt
   tokens a step: looked up, rows that share a run not yet cached with an earlier row of their
   batch set aside for a step (the first computes it; ASKS's pre-pass likewise, `defer`), then
   each held by one allocation (`RowMemory.hold`: its fill, an open segment of its whole
   uncached context; its first decode block; its token of the decode step's buffer), its chain
   pinned; a row that does not fit waits for rows to finish (after a preemption none is
   admitted until a row leaves); then the next part of each filling row (oldest first) and the
   rows that decode;
2. run: the evicted parts of every chain the step reads recomputed (ordinary prefill into open
   segments), ASKS's pre-passes, the score batches (delivered), the prefill parts in one forward,
   each written straight into its row's fill (a row whose prompt is in has its fill sealed into
   the token tree where it is, `RowMemory.store_prompt`, and samples its first token), then one
   decode forward over every running row, each writing its new K/V into its last open segment;
3. a row that meets EOS, a stop string or max tokens leaves at once (its decode chunks sealed
   in the store where they are, `RowMemory.seal`), and a call returns to its search as soon as
   its last row is done: no barrier over searches.
Rows carry their own seeds and prompts, so a result never depends on which rows shared a step.
After every step each call not yet returned has rows queued or running (`_check_rows`), and an
error inside a step fails every call not yet returned, so no thread waits on rows that are gone.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

import torch

from treesearch.cache.manager import Row
from treesearch.cache.shared_runs import shared_run_followers
from treesearch.common.errors import CacheBudgetError, SearchCancelled
from treesearch.engine.door import Door
from treesearch.engine.forward import sample
from treesearch.engine.memory import RowMemory
from treesearch.engine.plan import AsksPass, Part, StepPlan
from treesearch.engine.runner import Runner
from treesearch.engine.running import Call, GenRow, ScoreRow
from treesearch.engine.scoring import deliver, plan_scores, run_batch
from treesearch.policies.asks import plan_pass


class Scheduler:
    """Runs the rows of every call submitted to one engine, a step at a time (see the module)."""

    def __init__(self, runner: Runner, *, max_rows: int, step_tokens: int = 2048) -> None:
        self.runner = runner
        self.cache = runner.cache
        self.max_rows = max_rows
        self.step_tokens = step_tokens
        self.door = Door()  # the engine's lock; threads that want it between steps go first
        self._parked: dict[int, Call] = {}  # calls whose threads wait for them (`Call.wake`)
        self._live: dict[int, Call] = {}  # every call submitted and not returned yet
        self.gen_wait: deque[GenRow] = deque()
        self.score_wait: list[ScoreRow] = []
        self.filling: list[GenRow] = []  # admitted, their prompts not fully prefilled yet
        self.backoff = False  # a row was preempted: admit none while rows run, until one leaves
        self.running: list[GenRow] = []
        self.memory = RowMemory(runner)
        self.plan = StepPlan()  # the step being decided and run (`schedule`)
        self._busy = False
        self._order = itertools.count()
        self.on_step: Callable[[], None] | None = None  # called after every step (tests check invariants)
        # batch fill, for the bench: decode steps, rows they ran, steps with fewer rows than were ready
        self.steps = self.decode_steps = self.decode_rows = self.short_steps = 0

    def rows_held(self) -> int:
        """Admitted generate rows (filling or running): each holds K/V it gives back as it ends."""
        return len(self.filling) + len(self.running)

    def next_order(self) -> int:
        """The next admission number (LRU preemption takes the latest)."""
        return next(self._order)

    @property
    def lock(self) -> Door:
        """Held while a step runs; whoever touches the engine's state between steps holds it (and
        goes before the next step: `treesearch.engine.door`)."""
        return self.door

    # -- the callers' side ------------------------------------------------------------------------
    def submit(self, call: Call, items: list) -> list:
        """Queue a call's rows and wait until they are done, running steps while no one else does.
        A waiting thread sleeps on its own call (`Call.wake`): a step wakes only the threads whose
        calls ended, and one waiting thread when the stepping thread leaves."""
        with self.door:
            call.wake = self.door.cond()
            self._live[id(call)] = call
            if call.kind == "generate":
                self.gen_wait.extend(items)
            else:
                self.score_wait.extend(items)
        with self.door:
            try:
                self._wait_for(call)
            finally:
                self._live.pop(id(call), None)
        if call.error is not None:
            raise call.error
        return call.results

    def _wait_for(self, call: Call) -> None:
        """The submitting thread's loop (the lock held): park, or run steps, until call is done."""
        while True:
            if call.cancelled is not None and not call.done:
                raise SearchCancelled(str(call.cancelled) or type(call.cancelled).__name__)
            if call.done:
                break
            if self._busy:
                self._park(call)
                continue
            self._busy = True  # this thread runs the next step; the others park
            try:
                self.door.wait_turns()  # threads between steps (their next calls) go first
                if call.done or call.cancelled is not None:
                    continue  # ended meanwhile (cancelled): the next waiting thread steps
                self._step()
            except BaseException as exc:
                self._fail_all(exc)
                if not isinstance(exc, Exception):
                    raise
            finally:
                self._busy = False
                self._wake_after_step(call)

    def _park(self, call: Call) -> None:
        """Wait (the lock released) until a step wakes this call's thread."""
        self._parked[id(call)] = call
        try:
            call.wake.wait()
        finally:
            self._parked.pop(id(call), None)
            if call.counted:  # whoever woke it counted it in: it holds the lock again now
                call.counted = False
                self.door.passed()

    def _wake(self, call: Call) -> None:
        if id(call) in self._parked and not call.counted:
            call.counted = True
            self.door.count_in()
            call.wake.notify()

    def _wake_after_step(self, stepper: Call) -> None:
        """Wake the threads whose calls ended (or were cancelled), and, when the stepping thread's
        own call ended, one waiting thread to run the next steps."""
        waiting = list(self._parked.values())
        for c in waiting:
            if c.done or c.cancelled is not None:
                self._wake(c)
        if stepper.done or stepper.cancelled is not None:
            for c in waiting:
                if not c.counted:
                    self._wake(c)
                    break

    def cancel(self, stats: set[int], why: BaseException) -> None:
        """The calls of these searches (ids of their Stats) stop: their rows are dropped and their
        threads raise SearchCancelled."""
        with self.door:
            for call in list(self._live.values()):
                if not call.done and any(id(st) in stats for st in call.charge):
                    call.cancelled = why
                    self._drop(call)
                    self._wake(call)

    # -- one step: schedule (a plan, no forward), run it, apply what came out ---------------------------
    def _step(self) -> None:
        cache = self.cache
        ready = self.rows_held() + len(self.gen_wait)
        first = self.score_wait[:1] or self.filling[:1] or list(itertools.islice(self.gen_wait, 1))
        charge = (first or self.running[:1] or [None])[0]
        plan = self.plan = StepPlan()
        try:
            self.schedule()
            self._run(plan, ready)
        finally:
            self._close(plan)
            cache.end_call(None if charge is None else charge.stats)
            self.steps += 1
        if self.on_step is not None:
            self.on_step()
        self._check_rows()

    def schedule(self) -> StepPlan:
        """Decide the step into `self.plan`, running no forward: every running row whose decode
        chunks are full grown (or others preempted for it); score batches the store has room for;
        waiting generate rows admitted (one allocation each: their own K/V and their token of the
        decode step) within `step_tokens` and `max_rows`; the prefill parts; the rows that decode
        (the running ones and those whose prompts come in now)."""
        plan = self.plan
        for g in sorted(self.running, key=self.memory.rank, reverse=True):  # the most valuable grows first
            if g in self.running and g.room() == 0:
                self._grow(g)  # first: every later allocation counts the room the step's reads take back
        if self.score_wait:
            plan_scores(self, plan)
        left = self.step_tokens - sum(g.todo() for g in self.filling)
        if self.gen_wait and left > 0 and not (self.backoff and self.running):
            self._admit(left)  # after a preemption, rows wait for a running row to finish (no thrash)
        left = self.step_tokens
        plan.decode = list(self.running)
        for g in self.filling:  # the oldest first
            if left <= 0:
                break
            n = min(g.todo(), left)
            plan.parts.append(Part(g, n))
            left -= n
            if n == g.todo():
                plan.decode.append(g)  # its prompt comes in: it decodes in this step too
        went = {id(it) for b in plan.scores for it in b.items} | {id(g) for g in self.filling}
        for row, first in plan.followers:  # waited for a run only if its first row computes it now
            row.waited = id(first) in went
            if row.waited and isinstance(row, GenRow):
                row.after = first  # and waits until its prompt is in (`_admit`)
        return plan

    def _run(self, plan: StepPlan, ready: int) -> None:
        """Run the plan (`Runner`) and apply its results: the chains it reads made resident, ASKS's
        pre-passes, the score batches (delivered), the prefill parts (prompts that come in sealed
        and their first tokens sampled), the decode step (its tokens sampled; rows that end leave)."""
        run = self.runner
        run.recompute(plan)
        for p in plan.asks:
            run.run_asks(p)
        for batch in plan.scores:
            per, tails = run_batch(run, batch)
            deliver(self, batch, per, tails)
        if plan.parts:
            self._prompts_in(plan.parts, run.prefill(plan.parts))
        rows = [g for g in plan.decode if g in self.running]  # not those that ended at their first token
        if rows:
            logits = run.decode(rows)
            self.decode_steps += 1
            self.decode_rows += len(rows)
            self.short_steps += len(rows) < min(ready, self.max_rows)
            self._sample(rows, logits)

    def _close(self, plan: StepPlan) -> None:
        """After the step: segments of the plan's score batches and pre-passes that are still open
        (a forward that raised) go back to the store."""
        store = self.cache.store
        segs = [s for b in plan.scores for s in [*b.segs, b.tails] if s is not None]
        for seg in segs + [s for p in plan.asks for s in p.segs]:
            if seg.id in store.open_segments:
                store.close(seg)

    # -- admission (planning) -----------------------------------------------------------------------
    def _admit(self, left: int) -> None:
        """Waiting rows, in order, while `left` prompt tokens remain this step and `max_rows` allow:
        looked up together, those that wait a step set aside (`defer`), then held one by one
        (`RowMemory.hold`: one allocation) until one does not fit; they join `filling`. A row that
        cannot fit with nothing else holding K/V runs without its cached prefix (bare), or, if
        even that cannot fit, fails its call."""
        plan = self.plan
        popped: list[GenRow] = []  # off the queue, in order: those not admitted go back
        picked: list[GenRow] = []
        est = 0
        while self.gen_wait and est < left and self.rows_held() + len(picked) < self.max_rows:
            g = self.gen_wait.popleft()
            popped.append(g)
            if g.after is not None and g.after in self.filling:
                continue  # the row computing the run it shares is still prefilling it
            g.after = None
            est += len(g.context) - (1 if g.gens else 0) - g.row.matched  # uncached when it was submitted
            picked.append(g)
        plans = []
        for g in picked:
            ids = g.row.ids + g.gens[:-1]  # a resumed row computes its fed tokens again
            keep = g.row.must_store and not g.gens
            plans.append(Row(ids=ids, stats=g.stats, search=g.row.search, must_store=keep))
            plans[-1].bare, plans[-1].prepass = g.row.bare, g.row.prepass
        waits: set[int] = set()
        if self.runner.config.shares:
            self.cache.lookup(plans)
            waits = set(self.defer(plan, picked, plans))
        admitted: list[GenRow] = []
        failed: GenRow | None = None
        for k, (g, p) in enumerate(zip(picked, plans)):
            if k in waits or failed is not None or left <= 0:
                continue
            ok = self.memory.hold(g, p, plan.chains())
            if not ok and not admitted and not self.rows_held() and not plan.holds():
                ok = self._hold_alone(g, p)
            if not ok:
                failed = g
                continue
            left -= len(p.ids) - p.matched
            plan.reads.append((p.chain, g.stats))
            self.let_go(g.row)
            g.order = self.next_order()
            g.stats.recomputed_tokens += p.cut
            if not g.reused:
                g.asks_sigma, g.asks_ref = g.row.asks_sigma, g.row.asks_ref
            admitted.append(g)
        for g in reversed([g for g in popped if g not in admitted]):
            self.gen_wait.appendleft(g)
        if failed is not None and not admitted and not self.rows_held() and not plan.holds():
            self.fail_call(failed.call, self.memory.no_room(failed))  # nothing holds room that could free
        self.filling.extend(admitted)

    def _hold_alone(self, g: GenRow, p: Row) -> bool:
        """The first row to admit did not fit, and nothing holds K/V: with sharing on, try it
        without its cached prefix (bare: too little room for that context and its own K/V)."""
        if not self.runner.config.shares or p.bare:
            return False
        p.bare, g.row.bare = True, True
        self.cache.lookup([p])
        return self.memory.hold(g, p, self.plan.chains())

    def defer(self, plan: StepPlan, items: list, rows: list[Row]) -> list[int]:
        """Looked-up rows of one batch (generate or score) that wait a step: those that start with a
        run not yet cached that an earlier row of the batch starts with (that row computes it as
        part of its own prompt; they find it cached at the next step), and, under ASKS, those its
        pre-pass computes now (`_plan_asks`). A row waits once at most (for a run: once its first
        row was admitted or scored in that step, `schedule`; a generate row then until that row's
        prompt is in, `GenRow.after`)."""
        lead = shared_run_followers(rows, self.cache.share_min_tokens)
        waits = [k for k in lead if not items[k].waited]
        plan.followers += [(items[k], items[lead[k]]) for k in waits]
        if self.runner.config.kv_sharing == "asks":
            rest = [k for k in range(len(items)) if k not in waits and not items[k].waited]
            passed = self._plan_asks(plan, [items[k] for k in rest], [rows[k] for k in rest])
            waits += [rest[j] for j in passed]
            for k in passed:
                items[rest[k]].waited = True
        return sorted(waits)

    def _plan_asks(self, plan: StepPlan, items: list, rows: list[Row]) -> list[int]:
        """ASKS's pre-pass over these rows (`treesearch.policies.asks.plan_pass`), each row's part an
        open segment from the store, all or none (none: no gate this step, exact only). Returns the
        rows it computes: they wait for the next step."""
        got = plan_pass(rows)
        if got is None:
            return []
        pairs, order, ends = got
        chains = [rows[i].chain for i in order]
        sizes = [ends[i] - rows[i].matched for i in order]
        segs = self.cache.store.open_rows(sizes, self.runner.chunk, [*plan.chains(), *chains])
        if segs is None:
            return []
        for i in order:
            self.cache.pin(rows[i].chain)
            plan.reads.append((rows[i].chain, rows[i].stats))
        plan.asks.append(AsksPass(items, rows, pairs, order, ends, segs))
        return list(order)

    def let_go(self, row: Row) -> None:
        """A row no longer waits: the chains pinned for it across a step (`Row.held`) are let go."""
        for chain in row.held:
            self.cache.store.unpin(chain)
        row.held = []

    # -- the update: prompts in, tokens sampled ----------------------------------------------------------
    def _prompts_in(self, parts: list[Part], logits: torch.Tensor) -> None:
        """After the prefill forward: rows whose prompt is fully in join the running rows (their
        fills sealed in the tree), fresh ones with their first token sampled."""
        done, fresh = [], []
        for b, pt in enumerate(parts):
            g = pt.row
            if g.todo() == 0:
                done.append(g)
                if self._prompt_in(g):
                    fresh.append(b)
        for g in done:
            self.filling.remove(g)
        self.running.extend(done)
        if fresh:
            self._sample([parts[b].row for b in fresh], logits[fresh])

    def _prompt_in(self, g: GenRow) -> bool:
        """A row's context is fully prefilled: count its reuse (first admission) or its recomputation
        (a preempted row's), seal its fill in the store (`RowMemory.store_prompt` for a first
        admission, counted as its search's prompt); True when it samples its first token now."""
        p = g.plan
        assert p is not None
        shares = self.runner.config.shares
        if g.reused:  # a preempted row: all it computed now it had computed before
            g.stats.recomputed_tokens += len(p.ids) - p.matched
            if shares:
                self.memory.seal_prompt(g)
            return False
        g.reused, g.reused_n = True, p.matched - p.prepass
        g.stats.reused_tokens += g.reused_n
        if shares:
            g.handle = self.memory.store_prompt(g)
        return True

    def _sample(self, rows: list[GenRow], logits: torch.Tensor) -> None:
        """Each row's next token from its own generator; rows that end leave at once."""
        groups: dict[tuple, list[int]] = {}
        for b, g in enumerate(rows):
            groups.setdefault(g.sampling_key(), []).append(b)
        for idx in groups.values():
            sampling = rows[idx[0]].sampling
            toks, lps = sample(logits[idx], sampling, [rows[b].generator for b in idx])
            for b, t, lp in zip(idx, toks, lps):
                g = rows[b]
                g.gens.append(t)
                g.logps.append(lp)
                g.finish = self.runner.forward.finished(g.gens, sampling)
                if g.finish is None and len(g.gens) >= sampling.max_new_tokens:
                    g.finish = "length"
        for g in rows:
            if g.finish is not None:
                self._leave(g)

    # -- memory --------------------------------------------------------------------------------------
    def _grow(self, g: GenRow) -> None:
        """One more open segment for a row whose open segments are full, preempting others (or it)
        if need be."""
        n = self.memory.chunk_tokens(g)
        assert n > 0, "a running row with no slot left would have ended"
        if self.memory.regrow(g):
            return
        while g in self.running:
            seg = self.cache.store.open(n, self.runner.chunk)
            if seg is None:
                self._preempt(self._victim())
                continue
            g.chunks.append(seg)
            return

    def _victim(self) -> GenRow:
        if not self.rows_held():
            raise CacheBudgetError(
                f"cache_budget={self.cache.store.budget} bytes leave no room for one decode step; "
                "raise --cache-budget or run fewer searches at once"
            )
        return min([*self.running, *self.filling], key=self.memory.rank)

    def _free(self, g: GenRow) -> None:
        self.memory.free(g)
        for rows in (self.running, self.filling):
            if g in rows:
                rows.remove(g)

    def _preempt(self, g: GenRow) -> None:
        """Free an admitted row's K/V and requeue it first; what it had prefilled is computed
        again when it is readmitted (recomputed), its tokens and sampler are kept."""
        if g in self.filling:
            g.stats.recomputed_tokens += g.filled
        self._free(g)
        self.backoff = True
        self.plan.preempted.append(g)
        g.plan = None
        g.stats.preemptions += 1
        self.gen_wait.appendleft(g)

    # -- rows and calls ending ----------------------------------------------------------------------
    def _leave(self, g: GenRow) -> None:
        fed = len(g.gens) - 1
        if self.runner.config.shares and fed > 0 and g.handle is not None:
            ctx = g.row.ids + g.gens[:fed]
            start = max(len(g.row.ids), g.own_start())  # a resumed row may have sealed fed tokens
            if start < len(ctx):
                end = self.memory.seal(g, ctx, start)  # in place, else a copy below
                if end is None:
                    kv = g.own_kv(start)[:, :, :, : len(ctx) - start]
                    end = self.cache.store_kv(ctx, start, kv, free_only=True, charge=g.stats)
                g.handle = end
        self._free(g)
        self.backoff = False  # room that stays free: waiting rows may be admitted again
        g.call.deliver(g.index, self.runner.generation(g))
        self.maybe_done(g.call)

    def maybe_done(self, call: Call) -> None:
        if call.left == 0 and not call.done:
            self.runner.finish_call(call)
            call.done = True

    def fail_call(self, call: Call, exc: BaseException) -> None:
        call.error = exc
        self._drop(call)
        call.done = True

    def _drop(self, call: Call) -> None:
        for g in [g for g in [*self.running, *self.filling] if g.call is call]:
            self._free(g)
        mine = [g.row for g in self.gen_wait if g.call is call]
        for row in mine + [it.row for it in self.score_wait if it.call is call]:
            self.let_go(row)
        self.gen_wait = deque(g for g in self.gen_wait if g.call is not call)
        self.score_wait = [it for it in self.score_wait if it.call is not call]

    def _fail_all(self, exc: BaseException) -> None:
        """An error no single call caused (a bug, Ctrl-C inside a step): every call gets it, those
        whose rows the step held outside the queues when it raised included."""
        for call in list(self._live.values()):  # every queued row's call is live too
            if not call.done:
                self.fail_call(call, exc)
        self.cache.end_call()

    def _check_rows(self) -> None:
        """After a step: every call not yet returned has rows queued or running (or was cancelled).
        One whose rows are nowhere would have its thread run empty steps forever, so that is an error."""
        if self.gen_wait or self.score_wait or self.filling or self.running:
            return
        lost = [c for c in self._live.values() if not c.done and c.cancelled is None]
        if lost:
            raise RuntimeError(
                f"internal error: the scheduler holds no rows of {len(lost)} unfinished call(s) "
                f"({', '.join(f'{c.kind}: {c.left} of {c.n} rows left' for c in lost[:4])}); "
                "this is a bug in treesearch, please report it with the command that ran"
            )


def rule_key(rule: Any) -> Hashable:
    """Exit rules that say `merge_key()` are interchangeable when the keys are equal (CGEE's
    LayerExit with the same thresholds); any other rule object shares a forward only with itself."""
    key = getattr(rule, "merge_key", None)
    return key() if callable(key) else ("object", id(rule))


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed & 0x7FFFFFFFFFFFFFFF)
