"""Tools for testing strategies: `TableProblem`, a Problem whose whole tree is given as a table, and
`RecordingSearcher`, a real Searcher that records the batches a strategy hands to each operation.

The model still runs for every expansion (the searcher generates as usual), but `parse_children`
ignores the text and returns the children listed for the state, with the listed values, priors
and answers. So the tree a strategy builds is known exactly and its expansion order, beam
contents or MCTS statistics can be checked by hand. Use it to test your own strategy:

    problem = TableProblem({"": ["a", "b"], "a": ["a1"], "b": []}, {"a": .9, "b": .2, "a1": 1.0},
                           terminal={"a1"}, solved={"a1"})
    searcher = RecordingSearcher(tiny_model(), problem, MyStrategy(), progress=False)
    result = searcher.solve("")
    assert searcher.ops("expand") == [[0], [1]]   # root first, then a (node 1)
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping

from treesearch.config import Sampling
from treesearch.problem import Child, Problem
from treesearch.searcher import Searcher


class TableProblem(Problem):
    """States are strings; the root is the input (usually ""). `children[s]` lists s's child
    states (missing: none), `values[s]` is V(s), `priors[s]` the optional prior of s."""

    name = "table"
    labels = None

    def __init__(self, children: Mapping[str, list[str]], values: Mapping[str, float], *,
                 terminal: Iterable[str] = (), solved: Iterable[str] = (), priors: Mapping[str, float] | None = None,
                 max_depth: int = 3, value_range: tuple[float, float] = (0.0, 1.0), samples_per_expand: int = 1,
                 max_new_tokens: int = 1) -> None:
        self.children = {k: list(v) for k, v in children.items()}
        self.values = dict(values)
        self.terminal = set(terminal)
        self.solved = set(solved)
        self.priors = dict(priors or {})
        self.max_depth = max_depth
        self.value_range = value_range
        self.samples_per_expand = samples_per_expand
        self.sampling = Sampling(max_new_tokens=max_new_tokens)

    @classmethod
    def random(cls, seed: int, *, branching: int = 3, depth: int = 3, solved_share: float = 0.2,
               priors: bool = False, **kwargs) -> "TableProblem":
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
        return cls(children, values, terminal=level, solved=solved, priors=prior if priors else None,
                   max_depth=depth, **kwargs)

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


class RecordingSearcher(Searcher):
    """A real Searcher that also records, in `log`, each operation a strategy calls and its nodes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple[str, list[int]]] = []

    def expand(self, nodes: list[int]) -> list[list[int]]:
        self.log.append(("expand", list(nodes)))
        return super().expand(nodes)

    def evaluate(self, nodes: list[int]) -> list[float]:
        self.log.append(("evaluate", list(nodes)))
        return super().evaluate(nodes)

    def ops(self, kind: str) -> list[list[int]]:
        """The node batches of every `kind` ("expand" or "evaluate") call, in order."""
        return [nodes for k, nodes in self.log if k == kind]
