"""Trees for the view tests: a hand-built one carrying every mark, a large synthetic one, and a
small chain-style problem that a real (tiny-model) search expands.

Hand-built tree (scores in brackets, * = solution, x = pruned, f = frontier):

    0 root ---------------------------------+-------------+
    |                                       |             |
    1 [4.0] expanded                        2 [1.0] x     3 [2.0] f   (edge 0->3 marked asks=0.99)
    +-------------+------------+
    4 [20.0] *    5 [0.5] x    6 [None] f  (visits 3, value_sum 1.5)

KV chains: 1, 2, 3 -> [(1,10), (2,5)] / [(1,10), (3,5)] / [(1,10), (3,5)]  (2 and 3 came from one
generation), 4 -> [(1,10), (2,5), (4,6)], 5 -> [(1,10), (2,5), (5,6)], 6 -> none.
"""

from __future__ import annotations

import random

from treesearch import Child, Problem, Sampling
from treesearch.core.tree import ThoughtTree


def marked_tree() -> ThoughtTree:
    t = ThoughtTree()
    t.meta.update(problem="hand", input="x")
    t.add_root("start")
    t.set_status(0, "expanded")
    for thought, score in (("one", 4.0), ("two", 1.0), ("three", 2.0)):
        n = t.add_child(0, thought, f"s-{thought}")
        t.node(n)["score"] = score
    for thought, score in (("four", 20.0), ("five", 0.5), ("six", None)):
        n = t.add_child(1, thought, f"s-{thought}")
        t.node(n)["score"] = score
    t.set_status(1, "expanded")
    t.set_status(2, "pruned")
    t.set_status(4, "solution")
    t.node(4).update(solved=True, terminal=True, cgee="exit@12")
    t.set_status(5, "pruned")
    t.node(5)["evicted"] = True
    t.node(2)["cgee"] = "skipped"
    t.node(3)["cgee"] = "full"
    t.node(6).update(visits=3, value_sum=1.5)
    t.graph.edges[0, 3]["asks"] = 0.99
    chains = {
        1: [[1, 10], [2, 5]],
        2: [[1, 10], [3, 5]],
        3: [[1, 10], [3, 5]],
        4: [[1, 10], [2, 5], [4, 6]],
        5: [[1, 10], [2, 5], [5, 6]],
    }
    for n, c in chains.items():
        t.node(n)["kv_chain"] = c
    return t


def big_tree(n: int = 500, seed: int = 0, breadth: int = 3) -> ThoughtTree:
    """A BFS-shaped tree of n nodes: each step expands `breadth` kept nodes, the rest are pruned;
    the last kept node of the deepest step is a solution."""
    rng = random.Random(seed)
    t = ThoughtTree()
    t.add_root("root")
    kept = [0]
    while len(t) < n:
        new = []
        for p in kept:
            t.set_status(p, "expanded")
            for _ in range(rng.randint(3, 9)):
                if len(t) >= n:
                    break
                c = t.add_child(p, f"step {len(t)}", len(t))
                t.node(c)["score"] = round(rng.random() * 10, 3)
                new.append(c)
        new.sort(key=lambda c: (-t.node(c)["score"], c))
        for c in new[breadth:]:
            t.set_status(c, "pruned")
        kept = new[:breadth] or kept
    t.set_status(kept[0], "solution")
    t.node(kept[0])["solved"] = True
    return t


class Words(Problem):
    """Chain-style: each thought is one generated word; a child's prompt is its parent's plus the
    word, so it continues the parent's cached context. Values are programmatic (no LM scoring)."""

    name = "words"
    max_depth = 3
    samples_per_expand = 2
    sampling = Sampling(max_new_tokens=5, temperature=1.0)

    def expand_prompt(self, state: str) -> str:
        return "List words: " + state

    def parse_children(self, state: str, text: str) -> list[Child]:
        return [Child(w, f"{state} {w}") for w in text.split()[:2]]

    def value(self, state: str) -> float:
        return (sum(map(ord, state)) % 97) / 97

    def is_terminal(self, state: str) -> bool:
        return len(state.split()) >= 4


def words_search(lm, **config):
    """A BFS over Words with the tiny model; returns the SearchResult."""
    from strategies import BFS
    from treesearch import RKSCConfig, Searcher

    return Searcher(lm, Words(), BFS(breadth=2), RKSCConfig(**config), progress=False, seed=0).solve("go")
