"""The iteration-level scheduler of the local engine: every search's calls become rows of one
running batch, advanced a step at a time (continuous batching, as vLLM's and SGLang's schedulers).

The engine's lock is a `treesearch.engine.door.Door`: a thread that asks for it while a step runs
(to prepare or queue its next call, or to return from one that ended) gets it before the next
step, so a search's next call joins the very next step; a thread waiting for its call sleeps on
the call's own condition, woken when the call ends (or to run the steps, when the thread running
them leaves).

One step (under the engine's lock, run by whichever waiting thread finds no step running):
1. score rows that wait run, grouped by labels and exit rule, in batches that fit the budget;
2. prefill (`treesearch.engine.prefill`), at most `step_tokens` uncached prompt tokens a step:
   the next part of every admitted row whose prompt is not fully in (`filling`), then waiting
   generate rows admitted in arrival order (preempted rows first) into what is left, up to
   `max_rows` admitted: each is looked up, its chain pinned and made resident, and its K/V (its
   whole uncached context, its first decode chunk and its token of the decode step's buffer)
   reserved against the budget; `make_room` evicts unread blocks (lowest omega first, or LRU)
   for it. A row that still does not fit waits
   for running rows to finish (after a preemption none is admitted until a row leaves). The step's
   parts run as one forward (a cohort); a row whose prompt is in samples its first token, so a
   long prompt is prefilled over several steps, each beside the decode below;
3. every running row feeds its last token through one decode forward (`Forward.step`) over its
   chain, its prompt parts and its chunks; a row whose chunk is full is first copied into one
   chunk a block bigger (`RowMemory.regrow`) or, with no room for the copy, reserves one more
   block, and when even that cannot fit, the admitted row (running or filling) of lowest omega
   (LRU: the latest admitted) is preempted: its K/V freed, requeued first, recomputed when
   readmitted (lossless: it keeps its tokens and its sampler);
4. a row that meets EOS, a stop string or max tokens leaves at once, and a call returns to its
   search as soon as its last row is done: no barrier over searches.
Rows carry their own seeds and prompts, so a result never depends on which rows shared a step.
After every step each call not yet returned has rows queued or running (`check_rows`), and an
error inside a step fails every call not yet returned, so no thread waits on rows that are gone.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

import torch

from treesearch.cache.attention import BatchKV
from treesearch.common.errors import CacheBudgetError, SearchCancelled
from treesearch.engine.decoder import decoder_for
from treesearch.engine.door import Door
from treesearch.engine.forward import sample
from treesearch.engine.memory import RowMemory
from treesearch.engine.prefill import fill
from treesearch.engine.running import Call, GenRow, ScoreRow, generation
from treesearch.engine.scoring import run_scores


class Scheduler:
    """Runs the rows of every call submitted to one engine, a step at a time (see the module)."""

    def __init__(self, engine: Any, *, max_rows: int, step_tokens: int = 2048) -> None:
        self.engine = engine
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
        self.memory = RowMemory(engine)
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

    # -- one step -------------------------------------------------------------------------------------
    def _step(self) -> None:
        cache = self.engine.cache
        ready = self.rows_held() + len(self.gen_wait)
        charge = None
        try:
            if self.score_wait:
                charge = self.score_wait[0].stats
                run_scores(self)
            if self.gen_wait or self.filling:
                charge = charge or (self.filling or self.gen_wait)[0].stats
                self._fill()
            if self.running:
                charge = charge or self.running[0].stats
                self._decode(ready)
        finally:
            cache.end_call(charge)
            self.steps += 1
        if self.on_step is not None:
            self.on_step()
        check_rows(self)

    def _fill(self) -> None:
        """Admit and prefill (a part of each long prompt, `treesearch.engine.prefill`); rows whose
        prompt is in join the running rows, fresh ones with their first token."""
        done, fresh, logits = fill(self)
        self.running.extend(done)
        if fresh:
            assert logits is not None
            self._sample(fresh, logits)

    def _decode(self, ready: int) -> None:
        eng, cache = self.engine, self.engine.cache
        for g in sorted(self.running, key=self.memory.rank, reverse=True):  # the most valuable grows first
            if g in self.running and g.room() == 0:
                self._grow(g)
        rows = list(self.running)  # the step's buffer, a token a row, was reserved at admission
        if not rows:
            return
        lm = eng.lm
        fwd = eng.forward
        if fwd.decoder is not None and fwd.decoder.stale(lm.model):  # a weight changed in place
            fwd.decoder = decoder_for(lm.model)
        batch = BatchKV(lm.num_layers, len(rows), lm.num_kv_heads, lm.head_dim, 1, lm.dtype, lm.device)
        batch.set_prefixes([cache.prefix(g.plan.chain) + g.own_runs() for g in rows])  # type: ignore[union-attr]
        logits = eng.forward.step(
            batch,
            [g.gens[-1] for g in rows],
            [len(g.context) - 1 for g in rows],
            0,
            [g.stats for g in rows],
        )
        for b, g in enumerate(rows):
            g.write(batch.k[:, b, :, 0], batch.v[:, b, :, 0])
        self.decode_steps += 1
        self.decode_rows += len(rows)
        self.short_steps += len(rows) < min(ready, self.max_rows)
        self._sample(rows, logits)

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
                g.finish = self.engine.forward.finished(g.gens, sampling)
                if g.finish is None and len(g.gens) >= sampling.max_new_tokens:
                    g.finish = "length"
        for g in rows:
            if g.finish is not None:
                self._leave(g)

    # -- memory --------------------------------------------------------------------------------------
    def _grow(self, g: GenRow) -> None:
        """One more chunk for a row whose chunks are full, preempting others (or it) if need be."""
        n = self.memory.chunk_tokens(g)
        assert n > 0, "a running row with no slot left would have ended"
        if self.memory.regrow(g):
            return
        while g in self.running:
            try:
                self.engine.cache.reserve(n * self.engine.cache.store.bytes_per_token)
            except CacheBudgetError:
                self._preempt(self._victim())
                continue
            g.chunks.append([self.memory.chunk(n), 0])
            g.chunk_bytes += n * self.engine.cache.store.bytes_per_token
            return

    def _victim(self) -> GenRow:
        if not self.rows_held():
            raise CacheBudgetError(
                f"cache_budget={self.engine.cache.store.budget} bytes leave no room for one decode step; "
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
        g.plan = None
        g.stats.preemptions += 1
        self.gen_wait.appendleft(g)

    # -- rows and calls ending ----------------------------------------------------------------------
    def _leave(self, g: GenRow) -> None:
        eng = self.engine
        fed = len(g.gens) - 1
        if eng.config.shares and fed > 0 and g.handle is not None:
            ctx = g.row.ids + g.gens[:fed]
            assert g.plan is not None
            start = max(len(g.row.ids), g.plan.matched)  # a resumed row may have found fed tokens cached
            if start < len(ctx):
                kv = g.own_kv(start)[:, :, :, : len(ctx) - start]
                g.handle = eng.cache.store_kv(ctx, start, kv, free_only=True, charge=g.stats)
        self._free(g)
        self.backoff = False  # room that stays free: waiting rows may be admitted again
        g.call.deliver(g.index, generation(eng, g))
        self.maybe_done(g.call)

    def maybe_done(self, call: Call) -> None:
        if call.left == 0 and not call.done:
            self.engine.finish_call(call)
            call.done = True

    def fail_call(self, call: Call, exc: BaseException) -> None:
        call.error = exc
        self._drop(call)
        call.done = True

    def _drop(self, call: Call) -> None:
        for g in [g for g in [*self.running, *self.filling] if g.call is call]:
            self._free(g)
        self.gen_wait = deque(g for g in self.gen_wait if g.call is not call)
        self.score_wait = [it for it in self.score_wait if it.call is not call]

    def _fail_all(self, exc: BaseException) -> None:
        """An error no single call caused (a bug, Ctrl-C inside a step): every call gets it, those
        whose rows the step held outside the queues when it raised included."""
        for call in list(self._live.values()):  # every queued row's call is live too
            if not call.done:
                self.fail_call(call, exc)
        self.engine.cache.end_call()


def check_rows(sched: Scheduler) -> None:
    """After a step: every call not yet returned has rows queued or running (or was cancelled).
    One whose rows are nowhere would have its thread run empty steps forever, so that is an error."""
    if sched.gen_wait or sched.score_wait or sched.filling or sched.running:
        return
    lost = [c for c in sched._live.values() if not c.done and c.cancelled is None]
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
