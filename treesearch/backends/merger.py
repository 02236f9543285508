"""Many searches, one engine: each search's model calls are merged with the other searches' into
shared batched engine calls.

How it works. Every search runs in its own thread and talks to the engine through its own
`SearchSession`, a `treesearch.backends.protocol.Backend` that the search's `Searcher` uses like any other.
A session's `generate` / `score` does not run the model: it hands the call to the `CallMerger`
and waits. The merger counts the searches that are doing Python work (parsing, tree updates,
the strategy's own logic); when none is -- every live search waits on a call, or has finished --
the driver thread (`treesearch.search.many.solve_many`) takes all pending calls and runs them: the calls
that can share a batch (generate calls with the same sampling, score calls with the same labels
and an equivalent exit rule) become one engine call, whose rows the engine runs in batches that
fit (`Engine.max_batch`, the cache budget); rows that finish decoding leave their batch at once.
Then every waiting search gets its own results back and runs on. Strategies are unchanged: a
strategy's `searcher.expand(nodes)` is a blocking call, as in a search run alone.

Why results do not depend on which searches share a batch: every row carries its own seed and
its own prompt, a batched forward computes each row as it would alone (up to float rounding,
checked by the lossless tests), ASKS pairs rows of one search only, and each row's work is
counted in its own search's `Stats` (`stats=` per prompt). Owners (thought-tree node ids) are
namespaced per session, `(session id, node)`, so searches never release each other's K/V; RSBCM
ranks every block by its best owner's omega across all live searches.

A merged call that fails (a prompt too long for the model, a budget too small for a row) is run
again call by call, so the error reaches only the search that caused it.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import astuple, dataclass, field
from typing import Any

from treesearch.common.errors import TreeSearchError
from treesearch.common.stats import Stats


class SearchCancelled(TreeSearchError):
    """The run that this search belonged to stopped (Ctrl-C, or its caller stopped reading results)."""


@dataclass(eq=False)
class Call:
    """One search's pending engine call."""

    kind: str  # "generate" | "score"
    prompts: list[str]
    stats: Stats
    args: dict = field(default_factory=dict)  # sampling / labels / exit_rule, seeds, owners
    done: bool = False
    result: Any = None
    error: BaseException | None = None

    def merge_key(self) -> Hashable:
        """Calls with equal keys share one engine call."""
        if self.kind == "generate":
            s = self.args.get("sampling")
            return ("generate", None if s is None else astuple(s))
        rule = self.args.get("exit_rule")
        return ("score", tuple(self.args["labels"]), None if rule is None else _rule_key(rule))


def _rule_key(rule: Any) -> Hashable:
    """Exit rules that say `merge_key()` are interchangeable when the keys are equal (CGEE's
    LayerExit with the same thresholds); any other rule object merges only with itself."""
    key = getattr(rule, "merge_key", None)
    return key() if callable(key) else ("object", id(rule))


class CallMerger:
    """Collects the calls of concurrent searches and runs them merged when every search waits."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.lock = threading.RLock()  # held while the engine runs or a session touches it
        self._cv = threading.Condition()
        self._pending: list[Call] = []
        self._busy = 0  # searches doing their own work now (not waiting on a call)
        self._cancel: BaseException | None = None
        self.merged_calls = 0  # engine calls run for merged groups (for tests and benchmarks)

    # -- the search threads' side -----------------------------------------------------------------
    def started(self) -> None:
        with self._cv:
            self._busy += 1

    def finished(self) -> None:
        with self._cv:
            self._busy -= 1
            self._cv.notify_all()

    def submit(self, call: Call) -> Any:
        """Queue a call and wait for its result (raises the call's own error)."""
        with self._cv:
            if self._cancel is not None:
                raise SearchCancelled(str(self._cancel) or type(self._cancel).__name__)
            self._pending.append(call)
            self._busy -= 1
            self._cv.notify_all()
            while not call.done and self._cancel is None:
                self._cv.wait()
            self._busy += 1
            if not call.done:
                raise SearchCancelled(str(self._cancel) or type(self._cancel).__name__)
        if call.error is not None:
            raise call.error
        return call.result

    # -- the driver's side --------------------------------------------------------------------------
    def wait_idle(self) -> None:
        """Block until no search is doing its own work (each waits on a call or has finished)."""
        with self._cv:
            while self._busy > 0:
                self._cv.wait()

    def has_pending(self) -> bool:
        with self._cv:
            return bool(self._pending)

    def run_pending(self) -> None:
        """Run every pending call, merged where they can share a batch, then wake their searches."""
        with self._cv:
            calls, self._pending = self._pending, []
        groups: dict[Hashable, list[Call]] = {}
        for c in calls:
            groups.setdefault(c.merge_key(), []).append(c)
        with self.lock:
            for group in groups.values():
                self._run_group(group)
        with self._cv:
            for c in calls:
                c.done = True
            self._cv.notify_all()

    def cancel(self, why: BaseException) -> None:
        """Stop: every waiting search (and any that submits later) raises SearchCancelled."""
        with self._cv:
            self._cancel = why
            self._cv.notify_all()

    def _run_group(self, group: list[Call]) -> None:
        if len(group) > 1:
            try:
                outs = self._run(group)
            except Exception:  # one search's bad call must not fail the others: run them alone
                pass
            else:
                start = 0
                for c in group:
                    c.result = _local(outs[start : start + len(c.prompts)], start, len(c.prompts))
                    start += len(c.prompts)
                return
        for c in group:
            try:
                c.result = self._run([c])
            except Exception as exc:  # the search that made the call gets it
                c.error = exc

    def _run(self, group: list[Call]) -> list:
        """One engine call for the whole group."""
        first = group[0]
        prompts = [p for c in group for p in c.prompts]
        stats = [c.stats for c in group for _ in c.prompts]
        owners = _joined(group, "owners")
        self.merged_calls += 1
        if first.kind == "generate":
            return self.engine.generate(
                prompts, first.args.get("sampling"), seeds=_joined(group, "seeds"), owners=owners, stats=stats
            )
        rule = first.args.get("exit_rule")
        if rule is not None and len(group) > 1:
            rule = rule.fresh()  # an equivalent rule with no memory of any row (see _rule_key)
        return self.engine.score(prompts, first.args["labels"], owners=owners, exit_rule=rule, stats=stats)


def _joined(group: Sequence[Call], name: str) -> list | None:
    """The calls' per-prompt lists joined (None when no call gives one; a call without its own
    list then contributes None per prompt)."""
    if all(c.args.get(name) is None for c in group):
        return None
    return [x for c in group for x in (c.args.get(name) or [None] * len(c.prompts))]


def _local(results: list, start: int, n: int) -> list:
    """A call's share of a merged call's results, ASKS references renumbered within the call."""
    for r in results:
        ref = getattr(r, "asks_ref", None)
        if ref is not None:
            r.asks_ref = ref - start if start <= ref < start + n else None
    return results


class SearchSession:
    """One search's view of an engine shared with other searches (a `Backend`): its own Stats,
    its owners namespaced as (session id, node), its model calls merged by a `CallMerger`."""

    _ids = itertools.count()

    def __init__(self, merger: CallMerger) -> None:
        self.merger = merger
        engine = merger.engine
        self.id = next(self._ids)
        self.name = engine.name
        self.num_layers = engine.num_layers
        self.features = engine.features
        self.config = getattr(engine, "config", None)
        with merger.lock:
            self.stats: Stats = engine.begin_search()
        self.priority: Callable[[Hashable], float | None] | None = None
        self._owners: set = set()

    # -- model calls (merged) ---------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[str],
        sampling: Any = None,
        *,
        seeds: Sequence[int] | None = None,
        owners: Sequence[Hashable] | None = None,
    ) -> list:
        return self.merger.submit(
            Call(
                "generate",
                list(prompts),
                self.stats,
                {
                    "sampling": sampling,
                    "seeds": None if seeds is None else list(seeds),
                    "owners": self._own(owners),
                },
            )
        )

    def score(
        self,
        prompts: Sequence[str],
        labels: Sequence[str],
        *,
        owners: Sequence[Hashable] | None = None,
        exit_rule: Any = None,
    ) -> list:
        return self.merger.submit(
            Call(
                "score",
                list(prompts),
                self.stats,
                {"labels": list(labels), "exit_rule": exit_rule, "owners": self._own(owners)},
            )
        )

    def _own(self, owners: Sequence[Hashable] | None) -> list | None:
        if owners is None:
            return None
        out = [None if o is None else (self.id, o) for o in owners]
        with self.merger.lock:
            self._owners.update(o for o in out if o is not None)
        return out

    # -- everything else goes straight to the engine (under its lock) -------------------------------
    def tokenize(self, text: str) -> list[int]:
        with self.merger.lock:
            return self.merger.engine.tokenize(text)

    def token_offsets(self, generation: Any) -> list[tuple[int, int]]:
        with self.merger.lock:
            return self.merger.engine.token_offsets(generation)

    def remember_generation(self, prompt: str, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> None:
        with self.merger.lock:
            self.merger.engine.remember_generation(prompt, prompt_ids, token_ids)

    def label_token_ids(self, labels: Sequence[str]) -> list[int]:
        with self.merger.lock:
            return self.merger.engine.label_token_ids(labels)

    @property
    def max_context(self) -> int | None:
        return getattr(self.merger.engine, "max_context", None)

    def new_search(self) -> None:
        """A session serves one search: nothing to reset."""

    def set_priority(self, fn: Callable[[Hashable], float | None] | None) -> None:
        self.priority = fn

    def acquire(self, owner: Hashable, handle: Any) -> None:
        with self.merger.lock:
            self._owners.add((self.id, owner))
            self.merger.engine.acquire((self.id, owner), handle)

    def release(self, owner: Hashable) -> None:
        with self.merger.lock:
            self.merger.engine.release((self.id, owner))

    def pin_owner(self, owner: Hashable) -> None:
        with self.merger.lock:
            self._owners.add((self.id, owner))
            self.merger.engine.pin_owner((self.id, owner))

    def close(self) -> None:
        """The search is over: release everything it holds (its blocks become free at once)."""
        with self.merger.lock:
            for owner in self._owners:
                self.merger.engine.release(owner)
            self._owners = set()
            self.merger.engine.end_search(self.stats)


def session_priority(sessions: dict[int, SearchSession]) -> Callable[[Hashable], float | None]:
    """The engine's RSBCM priority over namespaced owners: (session id, node) -> that session's
    omega of the node; anything else (a pinned prompt's key) is unscored."""

    def priority(owner: Hashable) -> float | None:
        if isinstance(owner, tuple) and len(owner) == 2 and owner[0] in sessions:
            fn = sessions[owner[0]].priority
            return None if fn is None else fn(owner[1])
        return None

    return priority
