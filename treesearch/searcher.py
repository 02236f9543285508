"""`Searcher`: runs a strategy over a thought tree, with the engine doing all model work.

Strategies call only these operations: `expand(nodes)`, `evaluate(nodes)`, `prune(nodes)`,
`mark_solution(node)` and read `tree`. Each operation batches its nodes into one engine call,
so the branches of a step share one forward per phase.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .config import RKSCConfig, Sampling
from .engine import Engine, _mix
from .errors import ProblemDefinitionError
from .problem import Child, Problem, check_children, check_problem, check_prompt, check_value
from .runtime import LanguageModel
from .tree import ThoughtTree

log = logging.getLogger(__name__)


@dataclass
class SearchResult:
    """What `Searcher.solve` returns."""

    tree: ThoughtTree
    best: int | None
    answer: str | None
    solved: bool
    stats: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)

    def to_json(self, problem: Problem | None = None) -> dict:
        conv = problem.state_to_json if problem is not None else None
        return {"answer": self.answer, "solved": self.solved, "best": self.best, "stats": self.stats,
                "config": self.config, "tree": self.tree.to_json(conv)}


class Searcher:
    """Solve a `Problem` with a strategy (default BFS) and a language model."""

    def __init__(self, model: LanguageModel, problem: Problem, strategy: Any = None,
                 config: RKSCConfig | None = None, *, sampling: Sampling | None = None, seed: int = 0,
                 progress: bool = True) -> None:
        check_problem(problem)
        if strategy is None:
            from strategies import BFS

            strategy = BFS()
        self.model = model
        self.problem = problem
        self.strategy = strategy
        self.config = config or RKSCConfig()
        self.sampling = sampling or problem.sampling
        self.seed = seed
        self.progress = progress
        self.engine: Engine | None = None
        self.tree = ThoughtTree()
        self._values: dict[str, float] = {}
        self._bar = None

    # -- entry point -------------------------------------------------------------------------------
    def solve(self, x: Any) -> SearchResult:
        """Search from input x; returns the tree, the best node, its answer and the stats."""
        self.engine = Engine(self.model, self.config)
        self.tree = ThoughtTree()
        self._values = {}
        self.tree.meta.update(problem=self.problem.name, input=str(x), seed=self.seed,
                              strategy=type(self.strategy).__name__)
        root = self.tree.add_root(self.problem.initial_state(x))
        self._mark_new(root)
        self.engine.set_priority(self._omega)  # RSBCM: evict low score/(depth+1) first
        self.engine.pin_owner(root)  # the root prompt is never evicted
        t0 = time.perf_counter()
        self._bar = _progress(self.progress)
        try:
            best = self.strategy.run(self)
        finally:
            if self._bar is not None:
                self._bar.close()
        self.engine.stats.wall_s = time.perf_counter() - t0
        return self.result(best)

    def result(self, best: int | None) -> SearchResult:
        state = self.tree.node(best)["state"] if best is not None else None
        answer = self.problem.answer(state) if best is not None else None
        solved = bool(best is not None and self.problem.is_solved(state))
        return SearchResult(tree=self.tree, best=best, answer=answer, solved=solved,
                            stats=self.engine.stats.as_dict(), config=self.config.to_dict())

    # -- operations for strategies -----------------------------------------------------------------
    def expand(self, nodes: list[int]) -> list[list[int]]:
        """Generate and parse children for each node (one batched engine call). Returns child ids."""
        p, tree = self.problem, self.tree
        k = max(1, int(p.samples_per_expand))
        prompts, seeds, owners, who = [], [], [], []
        for n in nodes:
            prompt = check_prompt(p, "expand_prompt", p.expand_prompt(tree.node(n)["state"]))
            for j in range(k):
                prompts.append(prompt)
                seeds.append(_mix(self.seed, n, j))
                owners.append(n)
                who.append(n)
        gens = self.engine.generate(prompts, self.sampling, seeds=seeds, owners=owners)
        # Phase 1 calls every Problem method; phase 2 writes the tree. An exception (or Ctrl-C) in a
        # Problem method thus leaves the tree untouched: an expansion is all or nothing, and a
        # resumed search repeats it whole, with the same node ids.
        parsed: list[tuple[int, Any, list[tuple[Child, bool, bool]]]] = []
        seen: dict[int, set] = {n: set() for n in nodes}
        for n, gen in zip(who, gens):
            kept = []
            for c in check_children(p, p.parse_children(tree.node(n)["state"], gen.text)):
                key = p.state_key(c.state)
                if key in seen[n]:
                    continue
                seen[n].add(key)
                kept.append((c, *self._flags(c.state)))
            parsed.append((n, gen, kept))
        out: dict[int, list[int]] = {n: [] for n in nodes}
        for n, gen, kept in parsed:
            tree.node(n).setdefault("generations", []).append(gen.text)
            for c, terminal, solved in kept:
                cid = tree.add_child(n, c.thought, c.state, confidence=gen.confidence)
                d = tree.node(cid)
                if c.prior is not None:
                    d["prior"] = float(c.prior)
                d["kv"] = gen.handle
                self.engine.acquire(cid, gen.handle)
                d["terminal"], d["solved"] = terminal, solved
                out[n].append(cid)
        for n in nodes:
            tree.set_status(n, "expanded")
            tree.node(n)["empty_expansion"] = not out[n]
        self._tick(sum(len(v) for v in out.values()))
        return [out[n] for n in nodes]

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
                    f"{type(p).__name__}: neither value() nor value_prompt() gave a value for {state!r:.60}")
            prompt = check_prompt(p, "value_prompt", prompt)
            if prompt in self._values:
                values[n] = self._values[prompt]
            else:
                pending.setdefault(prompt, []).append(n)
        if pending:
            labels = list(p.labels)
            prompts = list(pending)
            scores = self.engine.score(prompts, labels, owners=[pending[q][0] for q in prompts])
            self.engine.stats.verify_calls += len(prompts)
            for q, s in zip(prompts, scores):
                v = sum(p.labels[lab] * s.probs[lab] for lab in labels)
                self._values[q] = v
                for n in pending[q]:
                    values[n] = check_value(p, v, tree.node(n)["state"])
                    tree.node(n)["label_probs"] = s.probs
        for n in nodes:
            tree.node(n)["score"] = values[n]
        return [values[n] for n in nodes]

    def prune(self, nodes: list[int]) -> None:
        for n in nodes:
            if self.tree.node(n)["status"] != "solution":
                self.tree.set_status(n, "pruned")
                self.engine.release(n)  # its KV blocks become free (evicted first)

    def mark_solution(self, node: int) -> None:
        self.tree.set_status(node, "solution")

    # -- helpers -------------------------------------------------------------------------------------
    def _mark_new(self, nid: int) -> None:
        d = self.tree.node(nid)
        d["terminal"], d["solved"] = self._flags(d["state"])

    def _flags(self, state: Any) -> tuple[bool, bool]:
        """(terminal, solved) of a state, from the problem."""
        terminal = bool(self.problem.is_terminal(state))
        return terminal, bool(terminal and self.problem.is_solved(state))

    def _omega(self, nid: Any) -> float | None:
        """RSBCM priority of a node: score / (depth + 1), None while unscored."""
        if nid not in self.tree:
            return None
        d = self.tree.node(nid)
        return None if d["score"] is None else d["score"] / (d["depth"] + 1)

    def _tick(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)
            self._bar.set_postfix(nodes=len(self.tree), refresh=False)


def _progress(enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(desc="search", unit="node", leave=False)
