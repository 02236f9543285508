"""Tools for testing strategies without a model (nothing here imports torch):

- `TableProblem`, a Problem whose whole tree is given as a table: `parse_children` ignores the
  text and returns the children listed for the state, with the listed values, priors and answers,
  so the tree a strategy builds is known exactly;
- `TableSearcher`, a model-free `treesearch.core.ops.SearchOps` that runs a strategy over such a
  problem and records, in `log`, the batches the strategy hands to `expand` and `evaluate`.

So expansion order, beam contents or MCTS statistics can be checked by hand, in milliseconds:

    problem = TableProblem({"": ["a", "b"], "a": ["a1"], "b": []}, {"a": .9, "b": .2, "a1": 1.0},
                           terminal={"a1"}, solved={"a1"})
    searcher = TableSearcher(problem, MyStrategy())
    result = searcher.solve("")
    assert searcher.ops("expand") == [[0], [1]]   # root first, then a (node 1)

`strategies.recording.RecordingSearcher` records the same way around the real `Searcher`.
"""

from __future__ import annotations

import copy
import random
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from treesearch.common.config import Sampling
from treesearch.common.errors import ProblemDefinitionError
from treesearch.core.cot import problem_for
from treesearch.core.problem import Child, Problem, check_children, check_problem, check_prompt, check_value
from treesearch.core.tree import ThoughtTree

from .base import Strategy


class TableProblem(Problem):
    """States are strings; the root is the input (usually ""). `children[s]` lists s's child
    states (missing: none), `values[s]` is V(s), `priors[s]` the optional prior of s."""

    name = "table"
    labels = None

    def __init__(
        self,
        children: Mapping[str, list[str]],
        values: Mapping[str, float],
        *,
        terminal: Iterable[str] = (),
        solved: Iterable[str] = (),
        priors: Mapping[str, float] | None = None,
        max_depth: int = 3,
        value_range: tuple[float, float] = (0.0, 1.0),
        samples_per_expand: int = 1,
        max_new_tokens: int = 1,
    ) -> None:
        self.children = {k: list(v) for k, v in children.items()}
        self.values = dict(values)
        self.terminal = set(terminal)
        self.solved = set(solved)
        self.priors = dict(priors or {})
        self.max_depth = max_depth
        self.value_range = value_range
        self.samples_per_expand = samples_per_expand
        self.sampling = Sampling(max_new_tokens=max_new_tokens)
        self.cot_sampling = Sampling(max_new_tokens=max_new_tokens)

    @classmethod
    def random(
        cls,
        seed: int,
        *,
        branching: int = 3,
        depth: int = 3,
        solved_share: float = 0.2,
        priors: bool = False,
        **kwargs,
    ) -> TableProblem:
        """A full tree of the given branching and depth; leaves at `depth` are terminal; values
        (two decimals) and priors drawn from Random(seed), a share of the leaves solved."""
        rng = random.Random(seed)
        children: dict[str, list[str]] = {}
        values: dict[str, float] = {}
        prior: dict[str, float] = {}
        level = [""]
        for _ in range(depth):
            nxt = []
            for s in level:
                children[s] = [s + "abcdefghij"[i] for i in range(branching)]
                weights = [rng.random() + 0.01 for _ in children[s]]
                for c, w in zip(children[s], weights):
                    values[c] = round(rng.random(), 2)
                    prior[c] = w / sum(weights)
                nxt += children[s]
            level = nxt
        solved = {s for s in level if rng.random() < solved_share}
        for s in solved:
            values[s] = 1.0
        return cls(
            children,
            values,
            terminal=level,
            solved=solved,
            priors=prior if priors else None,
            max_depth=depth,
            **kwargs,
        )

    def initial_state(self, x: object) -> str:
        return str(x)

    def expand_prompt(self, state: str) -> str:
        return f"Think about {state or 'the start'}:"

    def parse_children(self, state: str, text: str) -> list[Child]:
        return [Child(thought=c, state=c, prior=self.priors.get(c)) for c in self.children.get(state, ())]

    def value(self, state: str) -> float:
        if state not in self.values:
            raise KeyError(f"TableProblem has no value for state {state!r}; add it to `values`")
        return self.values[state]

    def is_terminal(self, state: str) -> bool:
        return state in self.terminal

    def is_solved(self, state: str) -> bool:
        return state in self.solved

    def answer(self, state: str) -> str | None:
        return state if state in self.terminal else None

    def cot_prompt(self, state: str) -> str:
        return f"Answer {state or 'the start'}:"

    def parse_cot(self, state: str, text: str) -> str:
        """A chain of thought's answer: the terminal state the text's CRC-32 picks (sorted order), so
        each generation text always gives the same answer (the root itself when none is terminal)."""
        leaves = sorted(self.terminal)
        return leaves[zlib.crc32(text.encode()) % len(leaves)] if leaves else state


class Recording:
    """Mixin for a `SearchOps` implementation: records in `log` each `expand` / `evaluate` call a
    strategy makes, with its nodes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple[str, list[int]]] = []

    def expand(self, nodes: list[int]) -> list[list[int]]:
        self.log.append(("expand", list(nodes)))
        return super().expand(nodes)  # type: ignore[misc]

    def evaluate(self, nodes: list[int]) -> list[float]:
        self.log.append(("evaluate", list(nodes)))
        return super().evaluate(nodes)  # type: ignore[misc]

    def ops(self, kind: str) -> list[list[int]]:
        """The node batches of every `kind` ("expand" or "evaluate") call, in order."""
        return [nodes for k, nodes in self.log if k == kind]


@dataclass
class TableResult:
    """What `TableOps.solve` and `TableOps.resume` return."""

    tree: ThoughtTree
    best: int | None
    answer: str | None
    solved: bool


def sample_text(j: int) -> str:
    """What `TableOps` gives as the j-th generation of a node: "sample j" (a problem may read j
    from it, as a test of self-consistency's vote does; `TableProblem` ignores it)."""
    return f"sample {j}"


class TableOps:
    """`SearchOps` without a model, as the `Searcher` does them: the j-th generation of a node is
    `sample_text(j)` (`samples_per_expand` per node), every value is the problem's programmatic
    one, and a strategy with `problem_for` searches the view of the problem it gives.

    An expansion calls the problem first and writes the tree after, so an exception leaves the
    tree as it was; `resume(tree)` runs the strategy again over a copy of an interrupted tree."""

    def __init__(self, problem: Problem, strategy: Strategy, *, seed: int = 0) -> None:
        problem = problem_for(strategy, problem)
        check_problem(problem)
        self.problem = problem
        self.strategy = strategy
        self.seed = seed
        self.tree = ThoughtTree()

    def solve(self, x: object) -> TableResult:
        self.tree = ThoughtTree()
        self.tree.meta.update(
            problem=self.problem.name, input=str(x), seed=self.seed, strategy=type(self.strategy).__name__
        )
        root = self.tree.add_root(self.problem.initial_state(x))
        d = self.tree.node(root)
        d["terminal"], d["solved"] = self._flags(d["state"])
        return self._run()

    def resume(self, tree: ThoughtTree) -> TableResult:
        self.tree = copy.deepcopy(tree)
        return self._run()

    def _run(self) -> TableResult:
        best = self.strategy.run(self)
        if best is None:
            return TableResult(self.tree, None, None, False)
        state = self.tree.node(best)["state"]
        return TableResult(self.tree, best, self.problem.answer(state), bool(self.problem.is_solved(state)))

    # -- SearchOps -------------------------------------------------------------------------------
    def expand(self, nodes: list[int]) -> list[list[int]]:
        p, tree = self.problem, self.tree
        k = max(1, int(p.samples_per_expand))
        for n in nodes:
            check_prompt(p, "expand_prompt", p.expand_prompt(tree.node(n)["state"]))
        parsed: list[tuple[int, str, list[tuple[Child, str, bool, bool]]]] = []
        proposed: dict[tuple[int, str], int] = {}  # (node, state key) -> generations that proposed it
        for n in nodes:
            seen: set = set()
            for j in range(k):
                kept, mine = [], set()
                text = sample_text(j)
                for c in check_children(p, p.parse_children(tree.node(n)["state"], text)):
                    key = p.state_key(c.state)
                    if key not in mine:
                        mine.add(key)
                        proposed[n, key] = proposed.get((n, key), 0) + 1
                    if key not in seen:
                        seen.add(key)
                        kept.append((c, key, *self._flags(c.state)))
                parsed.append((n, text, kept))
        out: dict[int, list[int]] = {n: [] for n in nodes}
        for n, text, kept in parsed:
            tree.node(n).setdefault("generations", []).append(text)
            for c, key, terminal, solved in kept:
                cid = tree.add_child(n, c.thought, c.state, samples=proposed[n, key])
                d = tree.node(cid)
                if c.prior is not None:
                    d["prior"] = float(c.prior)
                d["terminal"], d["solved"] = terminal, solved
                out[n].append(cid)
        for n in nodes:
            tree.set_status(n, "expanded")
            tree.node(n)["empty_expansion"] = not out[n]
        return [out[n] for n in nodes]

    def evaluate(self, nodes: list[int]) -> list[float]:
        p, tree = self.problem, self.tree
        values: dict[int, float] = {}
        for n in nodes:
            state = tree.node(n)["state"]
            v = p.value(state)
            if v is None:
                raise ProblemDefinitionError(
                    f"{type(p).__name__}.value() gave None for {state!r:.60}; "
                    "TableOps has no model: give every state a programmatic value"
                )
            values[n] = check_value(p, v, state)
        for n in nodes:
            tree.node(n)["score"] = values[n]
        return [values[n] for n in nodes]

    def prune(self, nodes: list[int]) -> None:
        for n in nodes:
            if self.tree.node(n)["status"] != "solution":
                self.tree.set_status(n, "pruned")

    def mark_solution(self, node: int) -> None:
        self.tree.set_status(node, "solution")

    def _flags(self, state: Any) -> tuple[bool, bool]:
        """As the real Searcher's (`treesearch.search.expansion.state_flags`)."""
        p = self.problem
        terminal = bool(p.is_terminal(state))
        return terminal, bool(terminal and not p.graded_by_reference and p.is_solved(state))


class TableSearcher(Recording, TableOps):
    """`TableOps` that records the batches a strategy hands to each operation (`log`, `ops`)."""
