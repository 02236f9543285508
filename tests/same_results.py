"""What "the same result" means for a search run inside many (solve_many, Ray workers): the
strategies and comparison the many-search tests share."""

from __future__ import annotations

from strategies import BFS, DFS, MCTS, Beam, evaluate_once, expand_once


class FirstChild:
    """A user's own strategy: always follow the first child, two levels down."""

    def run(self, searcher):
        node = searcher.tree.root
        for _ in range(2):
            kids = expand_once(searcher, [node])[0]
            if not kids:
                break
            evaluate_once(searcher, kids)
            node = kids[0]
        return node


STRATEGIES = {
    "bfs": lambda: BFS(breadth=2),
    "beam": lambda: Beam(width=2),
    "mcts": lambda: MCTS(iterations=6),
    "dfs": lambda: DFS(threshold=0.0, max_states=8),
    "custom": FirstChild,
}

COUNTED = ("decode_tokens", "generated_tokens", "unique_tokens", "verify_calls", "verify_skipped")


def signature(result):
    """Every node's id, parent, thought, state, status and score (rounded; compared within 1e-4 below)."""
    tree = result.tree
    return [
        (n, tree.parent(n), tree.node(n)["thought"], tree.node(n)["state"], tree.node(n)["status"])
        for n in sorted(tree.graph)
    ]


def assert_same(alone, many):
    assert len(alone) == len(many)
    for a, b in zip(alone, many):
        assert b.status == "complete", b.error
        assert signature(a) == signature(b)
        for n in a.tree.graph:
            x, y = a.tree.node(n)["score"], b.tree.node(n)["score"]
            assert (x is None and y is None) or abs(x - y) <= 1e-4
        assert (a.answer, a.solved, a.best, a.answer_node) == (b.answer, b.solved, b.best, b.answer_node)
        # the search's own work, counted in its own stats (prefill and reuse depend on which search
        # computed a shared prompt part first: it is counted once, there)
        assert {k: a.stats[k] for k in COUNTED} == {k: b.stats[k] for k in COUNTED}
