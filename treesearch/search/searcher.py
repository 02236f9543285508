"""`Searcher`: runs a strategy over a thought tree, with the engine doing all model work.

Strategies call only these operations: `expand(nodes)`, `evaluate(nodes)`, `prune(nodes)`,
`mark_solution(node)` and read `tree`. Each operation batches its nodes into one engine call,
so the branches of a step share one forward per phase.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from treesearch.backends.protocol import Backend, require_features
from treesearch.common.config import RKSCConfig, Sampling
from treesearch.common.errors import ProblemDefinitionError, ResumeError
from treesearch.common.seeds import stable_seed
from treesearch.core.problem import Child, Problem, check_children, check_problem, check_prompt, check_value
from treesearch.core.tree import ThoughtTree
from treesearch.models.model import LanguageModel
from treesearch.policies.cgee import span_confidence
from treesearch.policies.rsbcm import omega
from treesearch.search.checks import check_problem_instance, check_strategy, warn_greedy_duplicates
from treesearch.search.limits import within_context
from treesearch.search.result import SearchResult

if TYPE_CHECKING:
    from treesearch.engine.local import Engine
    from treesearch.search.verifier import Verifier

log = logging.getLogger(__name__)


class Searcher:
    """Solve a `Problem` with a strategy (default BFS) and a language model: a local
    `LanguageModel` (run by a local `Engine`) or any `treesearch.backends.protocol.Backend` (e.g. a server).

    keep_cache (default True): later solve() calls start with the K/V of the last search's prompts
    (few-shot templates), so a test set computes them once; results are the same without it."""

    def __init__(
        self,
        model: LanguageModel | Backend,
        problem: Problem,
        strategy: Any = None,
        config: RKSCConfig | None = None,
        *,
        sampling: Sampling | None = None,
        seed: int = 0,
        progress: bool = True,
        keep_cache: bool = True,
    ) -> None:
        check_problem_instance(problem)
        check_problem(problem)
        if strategy is None:
            from strategies import BFS

            strategy = BFS()
        check_strategy(strategy)
        self.model = model
        self.problem = problem
        self.strategy = strategy
        self.config = config or RKSCConfig()
        self.sampling = sampling or problem.sampling
        warn_greedy_duplicates(problem, self.sampling)
        self.seed = seed
        self.progress = progress
        self.keep_cache = keep_cache  # later solve() calls start with the last search's prompt K/V
        self.partial_result: SearchResult | None = None  # set when a search stops on an exception
        self.backend: Backend | None = None if isinstance(model, LanguageModel) else model
        if self.backend is not None:
            if not isinstance(self.backend, Backend):
                raise TypeError(
                    f"Searcher needs a LanguageModel (treesearch.load_model()) or a Backend "
                    f"(e.g. treesearch.ServerEngine(...)); got {type(model).__name__}"
                )
            require_features(self.backend, self.config)
        self.engine: Backend | None = None
        self.tree = ThoughtTree()
        self._values: dict[str, float] = {}
        self._bar = None

    # -- entry points ------------------------------------------------------------------------------
    def solve(self, x: Any) -> SearchResult:
        """Search from input x; returns the tree, the best node, its answer and the stats.

        Interruption: any exception (KeyboardInterrupt included) propagates unchanged, carrying the
        partial search as `exc.partial_result` (a SearchResult with status "interrupted"); it is
        also `searcher.partial_result`. Save it and continue later with `resume`.

        An input the problem refuses raises its `Problem.check_input` error (ParseError) first,
        before any model work."""
        self.problem.check_input(x)
        return self._solve_checked(x)

    def _solve_checked(self, x: Any) -> SearchResult:
        """`solve` of an input `Problem.check_input` has accepted (solve_many checks each itself)."""
        self.tree = ThoughtTree()
        self.tree.meta.update(
            problem=self.problem.name,
            input=str(x),
            input_type=type(x).__name__,  # resume re-checks the saved input only when it was text
            seed=self.seed,
            strategy=type(self.strategy).__name__,
            strategy_config=_describe(self.strategy),
            sampling=_describe(self.sampling),
        )
        root = self.tree.add_root(self.problem.initial_state(x))
        self._mark_new(root)
        return self._run()

    def resume(self, saved: SearchResult | ThoughtTree | str | Path) -> SearchResult:
        """Continue a search from a saved or interrupted one (a SearchResult, its tree, or a file
        written by `SearchResult.save`) to the result an uninterrupted run gives.

        How: the strategy runs again over a copy of the saved tree; strategies reuse the children
        and scores already on it (`strategies.base.expand_once` / `evaluate_once`), so the finished
        part costs no model call and the rest is generated with the same per-node seeds. The engine
        starts with an empty KV cache (results do not depend on it). The searcher must match the
        saved search: same problem, seed, sampling and strategy settings (ResumeError otherwise).
        `stats` count the work of this call; earlier calls' stats are in tree.meta["previous_stats"]."""
        if isinstance(saved, (str, Path)):
            saved = SearchResult.load(saved, self.problem)
        prev = saved.stats if isinstance(saved, SearchResult) else None
        tree = saved.tree if isinstance(saved, SearchResult) else saved
        if not isinstance(tree, ThoughtTree) or not len(tree):
            raise ResumeError(
                f"resume needs a SearchResult, a ThoughtTree with a root or a saved file; got {saved!r:.60}"
            )
        self._check_resumable(tree)
        if tree.meta.get("input_type") == "str" and isinstance(tree.meta.get("input"), str):
            self.problem.check_input(tree.meta["input"])  # before any model work, like solve
        self.tree = _fresh_copy(tree)
        if prev:
            self.tree.meta["previous_stats"] = list(self.tree.meta.get("previous_stats", [])) + [dict(prev)]
        return self._run()

    def solve_many(self, inputs: Iterable[Any], *, concurrency: int = 16) -> Iterator[SearchResult]:
        """Solve every input, up to `concurrency` searches at once over one engine and one KV
        store, their model calls merged into shared batches; yields each input's SearchResult in
        input order, as it finishes (see `treesearch.search.many`). Each result is the one `solve(x)`
        gives; a search that raises yields its partial result with status "failed"."""
        from treesearch.search.many import solve_many

        return solve_many(self, inputs, concurrency=concurrency)

    def shared_engine(self) -> Any:
        """The engine concurrent searches share: the backend, else this Searcher's local engine
        (kept between calls, like solve's with keep_cache)."""
        if self.backend is not None:
            return self.backend
        if (
            self.engine is None
            or not self.keep_cache
            or cast("Engine", self.engine).config is not self.config
        ):
            from treesearch.engine.local import Engine  # torch loads here, when a local engine is built

            assert isinstance(self.model, LanguageModel)  # no backend: the model is local
            self.engine = Engine(self.model, self.config, max_batch=64)
        self.engine.new_search()
        return self.engine

    def for_backend(self, backend: Backend) -> Searcher:
        """A Searcher with the same problem, strategy and settings whose model is `backend` (one
        search of `solve_many`), with no progress bar."""
        child = copy.copy(self)
        child.model = child.backend = backend
        child.engine, child.tree, child.partial_result, child._verifier_obj = None, ThoughtTree(), None, None
        child._values, child._bar, child.progress = {}, None, False
        return child

    def _run(self) -> SearchResult:
        """Run the strategy over self.tree; on any exception attach the partial result.

        The engine is fresh for the first search and after an interrupted one; otherwise, with
        keep_cache, it keeps the last search's prompt K/V (`Engine.new_search`), so a batch of
        puzzles computes its few-shot templates once. Results are the same either way."""
        if self.backend is not None:
            self.engine = self.backend
            self.engine.new_search()
        elif (
            self.engine is None
            or not self.keep_cache
            or cast("Engine", self.engine).config is not self.config
            or self.partial_result is not None
        ):
            from treesearch.engine.local import Engine

            assert isinstance(self.model, LanguageModel)  # no backend: the model is local
            self.engine = Engine(self.model, self.config)
        else:
            self.engine.new_search()
        self._values = {}
        self._prime_values()
        self._prime_tokens()
        self.engine.set_priority(self._omega)  # RSBCM: evict low score/(depth+1) first
        self.engine.pin_owner(self.tree.root)  # the root prompt is never evicted
        self.partial_result = None
        t0 = time.perf_counter()
        self._bar = _progress(self.progress, len(self.tree))
        try:
            best = self.strategy.run(self)
        except BaseException as exc:
            self.engine.stats.wall_s = time.perf_counter() - t0
            self._attach_partial(exc)
            raise
        finally:
            if self._bar is not None:
                self._bar.close()
        self.engine.stats.wall_s = time.perf_counter() - t0
        return self.result(best)

    def result(self, best: int | None, *, status: str = "complete", error: str | None = None) -> SearchResult:
        """The SearchResult of the tree: `best` is the strategy's choice, kept as given; the answer is
        read from `answer_node(best)`, the node that states the best answer on the tree."""
        node = self.answer_node(best)
        state = self.tree.node(node)["state"] if node is not None else None
        answer = self.problem.answer(state) if node is not None else None
        solved = bool(node is not None and self.problem.is_solved(state))
        return SearchResult(
            tree=self.tree,
            best=best,
            answer=answer,
            solved=solved,
            stats=self._engine.stats.as_dict(),
            config=self.config.to_dict(),
            status=status,
            error=error,
            problem=self.problem,
            answer_node=node,
        )

    def answer_node(self, best: int | None) -> int | None:
        """The node whose answer the search reports: the strategy's `best` if it states one (the
        problem's `answer(state)` is not None), else the best node that does -- solved first, then
        by value, then lower id; pruned nodes count (a strategy may prune an answer it values low).
        None when no node states an answer.

        Why: strategies pick `best` by their own criteria (value, path score, visits), and that may
        be a node that states no answer, e.g. a BFS state left at the frontier by the depth limit,
        valued above the finished answers beside it, or DFS's best visited state when the answer
        below it was pruned. The strategy's choice is kept whenever it answers (MCTS's
        `answer="visits"` still reports its most-visited terminal)."""
        tree, p = self.tree, self.problem
        if best is not None and p.answer(tree.node(best)["state"]) is not None:
            return best
        stating = [n for n in sorted(tree.graph) if p.answer(tree.node(n)["state"]) is not None]
        if not stating:
            return None

        def rank(n: int) -> tuple:
            d = tree.node(n)
            return (bool(p.is_solved(d["state"])), float("-inf") if d["score"] is None else d["score"], -n)

        return max(stating, key=rank)

    def _attach_partial(self, exc: BaseException) -> None:
        """Put the partial search on the exception (and on self) so nothing found is lost."""
        try:
            solutions = self.tree.nodes_with(status="solution")
            best = (
                max(solutions, key=lambda n: (self.tree.node(n)["score"] or 0.0, -n)) if solutions else None
            )
            part = self.result(best, status="interrupted", error=f"{type(exc).__name__}: {exc}"[:500])
        except Exception:  # never mask the original exception
            log.exception("could not build the partial result")
            return
        self.partial_result = part
        try:
            exc.partial_result = part  # type: ignore[attr-defined]
            if hasattr(exc, "add_note"):
                exc.add_note(
                    f"treesearch: the partial search ({len(self.tree)} nodes) is exc.partial_result; "
                    "save it with .save(path) and continue with Searcher.resume(...)"
                )
        except (AttributeError, TypeError):  # an exception type that takes no attributes
            pass

    def _check_resumable(self, tree: ThoughtTree) -> None:
        m = tree.meta
        mine = {
            "problem": self.problem.name,
            "seed": self.seed,
            "strategy": type(self.strategy).__name__,
            "strategy_config": _describe(self.strategy),
            "sampling": _describe(self.sampling),
        }
        for key, value in mine.items():
            if key in m and m[key] != value:
                raise ResumeError(
                    f"the saved search has {key}={m[key]!r} but this Searcher has {value!r}; build the "
                    f"Searcher with the saved search's {key} to continue it"
                )

    def _prime_tokens(self) -> None:
        """Give a fresh engine the tokenization memory of the search so far: each expanded node's
        prompt, then its generations' token ids, in node-id order (a parent before its children).
        Chain-style prompts extend a parent's prompt + generation and must keep the generated ids,
        not a re-tokenization of their text, for a resumed search to equal an uninterrupted one."""
        for n in sorted(self.tree.graph):
            d = self.tree.node(n)
            if not any(d.get("generation_ids") or []):  # none, or a server's (no ids): nothing to remember
                continue
            prompt = self.problem.expand_prompt(d["state"])
            if not isinstance(prompt, str) or not prompt:
                continue
            ids = self._engine.tokenize(prompt)
            for gen in d["generation_ids"]:
                self._engine.remember_generation(prompt, ids, gen)

    def _prime_values(self) -> None:
        """Re-enter the LM values already on the tree into the prompt -> value memo, so a resumed
        search reuses them exactly as the uninterrupted search would have."""
        p = self.problem
        for _, d in self.tree.graph.nodes(data=True):
            if d.get("score") is not None and "label_probs" in d and d.get("cgee") != "skipped":
                prompt = p.value_prompt(d["state"])
                if isinstance(prompt, str):
                    self._values.setdefault(prompt, d["score"])

    # -- operations for strategies -----------------------------------------------------------------
    @within_context("expand")
    def expand(self, nodes: list[int]) -> list[list[int]]:
        """Generate and parse children for each node (one batched engine call). Returns child ids."""
        p, tree = self.problem, self.tree
        k = max(1, int(p.samples_per_expand))
        prompts, seeds, owners, who = [], [], [], []
        for n in nodes:
            prompt = check_prompt(p, "expand_prompt", p.expand_prompt(tree.node(n)["state"]))
            for j in range(k):
                prompts.append(prompt)
                seeds.append(stable_seed(self.seed, n, j))
                owners.append(n)
                who.append(n)
        gens = self._engine.generate(prompts, self.sampling, seeds=seeds, owners=owners)
        # Phase 1 calls every Problem method; phase 2 writes the tree. An exception (or Ctrl-C) in a
        # Problem method thus leaves the tree untouched: an expansion is all or nothing, and a
        # resumed search repeats it whole, with the same node ids.
        parsed: list[tuple[int, Any, list[tuple[Child, float, bool, bool]]]] = []
        seen: dict[int, set] = {n: set() for n in nodes}
        for n, gen in zip(who, gens):
            kept = []
            offsets = None  # character range of each generated token, built once if a child has a span
            for c in check_children(p, p.parse_children(tree.node(n)["state"], gen.text)):
                key = p.state_key(c.state)
                if key in seen[n]:
                    continue
                seen[n].add(key)
                if c.span is not None and offsets is None:
                    offsets = self._engine.token_offsets(gen)
                # CGEE Level 1: the child's own confidence (its span's tokens), else the generation's
                confidence = span_confidence(offsets or [], gen.logprobs, c.span, len(gen.text))
                kept.append((c, confidence, *self._flags(c.state)))
            parsed.append((n, gen, kept))
        out: dict[int, list[int]] = {n: [] for n in nodes}
        for n, gen, kept in parsed:
            tree.node(n).setdefault("generations", []).append(gen.text)
            tree.node(n).setdefault("generation_ids", []).append(list(gen.token_ids))  # for resume
            if gen.asks_ref is not None:  # ASKS: this expansion's prompt attached to another node's K/V
                tree.node(n)["asks_expand"] = {"ref": who[gen.asks_ref], "sigma": gen.asks_sigma}
            for c, confidence, terminal, solved in kept:
                cid = tree.add_child(n, c.thought, c.state, confidence=confidence)
                d = tree.node(cid)
                if c.prior is not None:
                    d["prior"] = float(c.prior)
                d["kv"] = gen.handle
                self._engine.acquire(cid, gen.handle)
                d["terminal"], d["solved"] = terminal, solved
                out[n].append(cid)
        for n in nodes:
            tree.set_status(n, "expanded")
            tree.node(n)["empty_expansion"] = not out[n]
        self._tick(sum(len(v) for v in out.values()))
        return [out[n] for n in nodes]

    @within_context("evaluate")
    def evaluate(self, nodes: list[int]) -> list[float]:
        """Value each node: the problem's programmatic value, else one LM scoring pass (batched)."""
        p, tree = self.problem, self.tree
        values: dict[int, float] = {}
        pending: dict[str, list[int]] = {}
        for n in nodes:
            state = tree.node(n)["state"]
            v = p.value(state)
            if v is not None:
                values[n] = check_value(p, v, state)
                continue
            prompt = p.value_prompt(state)
            if prompt is None:
                raise ProblemDefinitionError(
                    f"{type(p).__name__}: neither value() nor value_prompt() gave a value for {state!r:.60}"
                )
            prompt = check_prompt(p, "value_prompt", prompt)
            if prompt in self._values:
                values[n] = self._values[prompt]
            else:
                pending.setdefault(prompt, []).append(n)
        if pending:  # LM valuations, with CGEE when on (treesearch.search.verifier)
            found, reusable = self._verifier().value(tree, pending)
            self._values.update(reusable)
            for n, (v, probs) in found.items():
                values[n] = check_value(p, v, tree.node(n)["state"])
                if probs is not None:
                    tree.node(n)["label_probs"] = probs
        for n in nodes:
            tree.node(n)["score"] = values[n]
        return [values[n] for n in nodes]

    def prune(self, nodes: list[int]) -> None:
        for n in nodes:
            if self.tree.node(n)["status"] != "solution":
                self.tree.set_status(n, "pruned")
                self._engine.release(n)  # its KV blocks become free (evicted first)

    def mark_solution(self, node: int) -> None:
        self.tree.set_status(node, "solution")

    # -- helpers -------------------------------------------------------------------------------------
    verify_trace: dict[str, list[list[float]]] | None = None
    """When a dict, LM valuations run full passes and record in it, per value prompt, the label
    probabilities after every layer (the last = the full pass): what `treesearch calibrate` fits
    CGEE on. Set it before `solve`; a new dict per search keeps each search's calls apart."""

    _verifier_obj: Verifier | None = None  # the Verifier of the current engine and trace

    @property
    def _engine(self) -> Backend:
        """The engine of the search under way (`_run` and `shared_engine` set it)."""
        assert self.engine is not None, "no search is under way"
        return self.engine

    def _verifier(self) -> Verifier:
        """The Verifier of the current engine (CGEE thresholds: the config's, else calibrated)."""
        from treesearch.policies.cgee import thresholds_for
        from treesearch.search.verifier import Verifier

        v = self._verifier_obj
        if v is None or v.engine is not self.engine or v.trace is not self.verify_trace:
            labels = self.problem.labels
            assert labels is not None  # check_problem: a problem with value prompts has labels
            t = thresholds_for(self.config, self._engine.name, self.problem.name)
            v = Verifier(self._engine, labels, self.config, t, trace=self.verify_trace)
            self._verifier_obj = v
        return v

    def _mark_new(self, nid: int) -> None:
        d = self.tree.node(nid)
        d["terminal"], d["solved"] = self._flags(d["state"])

    def _flags(self, state: Any) -> tuple[bool, bool]:
        """(terminal, solved) of a state, from the problem."""
        terminal = bool(self.problem.is_terminal(state))
        return terminal, bool(terminal and self.problem.is_solved(state))

    def _omega(self, nid: Any) -> float | None:
        """RSBCM priority of a node (`treesearch.policies.rsbcm.omega`); None for a node not in the tree."""
        if nid not in self.tree:
            return None
        d = self.tree.node(nid)
        return omega(d["score"], d["depth"])

    def _tick(self, n: int) -> None:
        """Count n new nodes on the progress bar (which shows the tree's size, root included)."""
        if self._bar is not None:
            self._bar.update(n)


def _describe(obj: Any) -> Any:
    """A JSON-able description of a dataclass's settings (else its class name), for resume checks."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return json.loads(json.dumps(dataclasses.asdict(obj), default=repr))
    return type(obj).__name__


def _fresh_copy(tree: ThoughtTree) -> ThoughtTree:
    """A deep copy of a tree without KV handles (they belong to the engine that made them)."""
    out = ThoughtTree()
    out.meta = copy.deepcopy(tree.meta)
    for n, d in tree.graph.nodes(data=True):
        attrs = copy.deepcopy({k: v for k, v in d.items() if k != "kv"})
        out.graph.add_node(n, kv=None, **attrs)
    for u, v, e in tree.graph.edges(data=True):
        out.graph.add_edge(u, v, **copy.deepcopy(e))
    return out


def _progress(enabled: bool, nodes: int):
    """A progress bar counting the tree's nodes, starting at its current size (root, resumed nodes)."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(desc="search", unit=" nodes", initial=nodes, leave=False)
