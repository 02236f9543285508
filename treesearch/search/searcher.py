"""`Searcher`: runs a strategy over a thought tree, with the engine doing all model work.

Strategies call only these operations: `expand(nodes)`, `evaluate(nodes)`, `prune(nodes)`,
`mark_solution(node)` and read `tree`. Each operation batches its nodes into one engine call,
so the branches of a step share one forward per phase.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from treesearch.backends.protocol import Backend, require_features
from treesearch.common.config import RKSCConfig, Sampling
from treesearch.core.cot import problem_for
from treesearch.core.problem import Problem, check_problem
from treesearch.core.tree import ThoughtTree
from treesearch.models.model import LanguageModel
from treesearch.policies.rsbcm import omega
from treesearch.search.answers import answer_node, best_solution
from treesearch.search.checks import check_problem_instance, check_strategy, warn_greedy_duplicates
from treesearch.search.evaluation import evaluate_nodes, new_verifier, prime_values
from treesearch.search.expansion import expand_nodes, state_flags
from treesearch.search.limits import within_context
from treesearch.search.progress import progress_bar
from treesearch.search.result import SearchResult
from treesearch.search.resuming import fresh_copy, model_settings, prime_tokens, saved_search, search_settings
from treesearch.search.stop import depth_limit, diagnose, stopped_by

if TYPE_CHECKING:
    from treesearch.engine.local import Engine
    from treesearch.search.verifier import Verifier

log = logging.getLogger(__name__)


class Searcher:
    """Solve a `Problem` with a strategy (default BFS) and a language model: a local
    `LanguageModel` (run by a local `Engine`) or any `treesearch.backends.protocol.Backend` (e.g. a server).

    A strategy with `problem_for(problem)` searches the view of the problem it gives (`strategies.CoT`:
    the task's chain of thought, `treesearch.core.cot`); `searcher.problem` is that view.

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
        if strategy is None:
            from strategies import BFS

            strategy = BFS()
        check_strategy(strategy)
        problem = problem_for(strategy, problem)  # CoT: the task's chain-of-thought view
        check_problem(problem)
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
        self.model_settings = model_settings(model)  # recorded in the tree; a resume must match it
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
            input=str(x),
            input_type=type(x).__name__,  # resume re-checks the saved input only when it was text
            **self.settings(),
        )
        root = self.tree.node(self.tree.add_root(self.problem.initial_state(x)))
        root["terminal"], root["solved"] = state_flags(self.problem, root["state"])
        return self._run()

    def resume(self, saved: SearchResult | ThoughtTree | str | Path, x: Any = None) -> SearchResult:
        """Continue a search from a saved or interrupted one (a SearchResult, its tree, or a file
        written by `SearchResult.save`) to the result an uninterrupted run gives.

        How: the strategy runs again over a copy of the saved tree; strategies reuse the children
        and scores already on it (`strategies.base.expand_once` / `evaluate_once`), so the finished
        part costs no model call and the rest is generated with the same per-node seeds. The engine
        starts with an empty KV cache (results do not depend on it). The searcher must match the
        saved search: same problem, model, seed, sampling, strategy settings, KV sharing mode and
        CGEE (`settings()`), and, when `x` is given, the same input; ResumeError otherwise, naming
        both values. `stats` count the work of this call; earlier calls' stats are in
        tree.meta["previous_stats"]."""
        tree, prev = saved_search(saved, self.problem, self.settings(), x)
        if tree.meta.get("input_type") == "str" and isinstance(tree.meta.get("input"), str):
            self.problem.check_input(tree.meta["input"])  # before any model work, like solve
        self.tree = fresh_copy(tree)
        if prev:
            self.tree.meta["previous_stats"] = list(self.tree.meta.get("previous_stats", [])) + [dict(prev)]
        return self._run()

    def settings(self) -> dict[str, Any]:
        """What this Searcher's searches record in tree.meta and a resume must match: the problem,
        model, seed, strategy, sampling and the RKSC settings that change a result
        (`treesearch.search.resuming.search_settings`)."""
        return {
            **search_settings(self.problem, self.strategy, self.sampling, self.seed, self.config),
            **self.model_settings,
        }

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
        prime_values(self.problem, self.tree, self._values)
        prime_tokens(self.engine, self.problem, self.tree)
        self.engine.set_priority(self._omega)  # RSBCM: evict low score/(depth+1) first
        self.engine.pin_owner(self.tree.root)  # the root prompt is never evicted
        self.partial_result = None
        t0 = time.perf_counter()
        self.tree.meta.pop("stop_reason", None)  # a resumed search's reason is its own
        self._bar = progress_bar(self.progress, len(self.tree))
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
        read from `answer_node(best)`, the node that states the best answer on the tree; the stop
        reason (`treesearch.search.stop`) is also written to tree.meta["stop_reason"] for its views."""
        node = self.answer_node(best)
        state = self.tree.node(node)["state"] if node is not None else None
        if status == "complete":
            stop = diagnose(self.tree, depth_limit(self.strategy, self.problem.max_depth), self.strategy)
        else:
            stop = stopped_by(status, error)
        self.tree.meta["stop_reason"] = stop.to_json() if stop is not None else None
        return SearchResult(
            tree=self.tree,
            best=best,
            answer=self.problem.answer(state) if node is not None else None,
            solved=bool(node is not None and self.problem.is_solved(state)),
            stats=self._engine.stats.as_dict(),
            config=self.config.to_dict(),
            status=status,
            error=error,
            problem=self.problem,
            answer_node=node,
            stop_reason=stop,
        )

    def answer_node(self, best: int | None) -> int | None:
        """The node whose answer the search reports: the strategy's `best` if it states one, else
        the best node that does (solved first, then by value, then lower id; pruned ones count);
        None when no node states an answer (`treesearch.search.answers.answer_node` says why)."""
        return answer_node(self.tree, self.problem, best)

    def _attach_partial(self, exc: BaseException) -> None:
        """Put the partial search on the exception (and on self) so nothing found is lost."""
        try:
            error = f"{type(exc).__name__}: {exc}"[:500]
            part = self.result(best_solution(self.tree), status="interrupted", error=error)
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

    # -- operations for strategies -----------------------------------------------------------------
    @within_context("expand")
    def expand(self, nodes: list[int]) -> list[list[int]]:
        """Generate and parse children for each node (one batched engine call). Returns child ids
        (`treesearch.search.expansion`: all or nothing, seeded per node and sample)."""
        out = expand_nodes(self.problem, self.tree, self._engine, self.sampling, self.seed, nodes)
        self._tick(sum(len(kids) for kids in out))
        return out

    @within_context("evaluate")
    def evaluate(self, nodes: list[int]) -> list[float]:
        """Value each node: the problem's programmatic value, else one LM scoring pass (batched;
        `treesearch.search.evaluation`)."""
        return evaluate_nodes(self.problem, self.tree, nodes, self._values, self._verifier)

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
        """The Verifier of the current engine and trace, built once for them."""
        v = self._verifier_obj
        if v is None or v.engine is not self.engine or v.trace is not self.verify_trace:
            v = self._verifier_obj = new_verifier(self._engine, self.problem, self.config, self.verify_trace)
        return v

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
