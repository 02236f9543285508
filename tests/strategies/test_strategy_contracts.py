"""Contracts every strategy keeps, parametrised over one list of strategy factories (adding a
strategy adds one line to STRATEGIES): configuration only, determinism for a fixed seed, batch
sizes honoured and no operation repeated, nothing left half-done, running again is harmless, and
an interrupted search resumed from its tree (also through a JSON round trip) gives exactly the
tree of an uninterrupted run. Trees come from `TableProblem.random` (known tree), searched by the
model-free `TableSearcher`: no model and no torch (test_strategies.py checks that the real Searcher
builds the same trees).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strategies import BFS, DFS, MCTS, Beam, SelfConsistency, is_expanded
from strategies.testing import TableProblem, TableSearcher
from treesearch.core.cot import ChainOfThought
from treesearch.core.tree import STATUSES, ThoughtTree

# (id, factory, most nodes per expand call, TableProblem.random options)
STRATEGIES = [
    ("bfs", lambda: BFS(breadth=2), 2, {}),
    ("beam-mean", lambda: Beam(width=2, aggregate="mean", stop_on_solution=False), 2, {}),
    ("beam-product", lambda: Beam(width=3, aggregate="product"), 3, {}),
    ("mcts-uct", lambda: MCTS(iterations=12, exploration=0.7), 1, {}),
    ("mcts-puct", lambda: MCTS(iterations=12, exploration=1.5, answer="value"), 1, {"priors": True}),
    (
        "mcts-rollout",
        lambda: MCTS(iterations=8, evaluation="rollout", rollout_policy="random", seed=3),
        1,
        {},
    ),
    ("dfs", lambda: DFS(threshold=0.3, max_states=8, stop_on_solution=False), 1, {}),
    ("sc", lambda: SelfConsistency(samples=9), 1, {}),
]
# Strategies whose children are read from the generation's text (TableProblem.parse_cot), so a
# model's text gives other children than TableOps' "sample j" (test_strategies compares the two)
TEXT_PARSED = {"sc"}
IDS = [s[0] for s in STRATEGIES]
params = pytest.mark.parametrize("make, batch, opts", [s[1:] for s in STRATEGIES], ids=IDS)


class Interrupted(Exception):
    """Raised by `Flaky` to simulate a crash or Ctrl-C in the middle of a search."""


class Flaky(TableProblem):
    """A TableProblem that counts its method calls and raises Interrupted at call number `fail_at`."""

    fail_at: int | None = None
    calls: int = 0

    def _call(self) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise Interrupted(f"problem call {self.calls}")

    def expand_prompt(self, state):
        self._call()
        return super().expand_prompt(state)

    def parse_children(self, state, text):
        self._call()
        return super().parse_children(state, text)

    def value(self, state):
        self._call()
        return super().value(state)

    def is_terminal(self, state):
        self._call()
        return super().is_terminal(state)


def problem(opts: dict, seed: int = 7) -> Flaky:
    return Flaky.random(seed, branching=3, depth=3, **opts)


def searcher(prob, strategy) -> TableSearcher:
    return TableSearcher(prob, strategy)


def signature(tree: ThoughtTree) -> list[tuple]:
    """Everything a search leaves on the tree, node by node (KV handles aside)."""
    keys = ("thought", "state", "depth", "score", "status", "terminal", "solved", "visits", "value_sum")
    return [
        (
            n,
            tree.parent(n),
            *(d[k] for k in keys),
            d.get("prior"),
            d.get("empty_expansion"),
            tuple(d.get("generations", ())),
        )
        for n, d in sorted(tree.graph.nodes(data=True))
    ]


def table_children(prob: TableProblem, view, state: str, generations: list[str]) -> list[str]:
    """The children an expansion of `state` gives: the table's, or (a strategy's view of the
    problem, e.g. self-consistency's chains) each generation's chain answer, first seen first."""
    if not isinstance(view, ChainOfThought):
        return prob.children.get(state, [])
    return list(dict.fromkeys(TableProblem.parse_cot(prob, state, g) for g in generations))


def check_complete(tree: ThoughtTree, prob: TableProblem, view=None) -> None:
    """Nothing half-done: each node is either unexpanded without children, or expanded with all of
    its children (the table's, or the view's) in order; pruned nodes are never expanded; MCTS
    counts add up."""
    for n, d in tree.graph.nodes(data=True):
        kids = tree.children(n)
        assert d["status"] in STATUSES, (n, d["status"])
        if is_expanded(tree, n):
            want = table_children(prob, view, d["state"], d.get("generations", []))
            assert [tree.node(c)["state"] for c in kids] == want, n
            assert not d["terminal"] and d["status"] != "pruned", n
        else:
            assert kids == [], f"node {n} has children but is not marked expanded"
        if d["status"] == "solution":
            assert d["solved"] and d["terminal"], n
        assert d["visits"] >= sum(tree.node(c)["visits"] for c in kids), n
        assert (d["visits"] == 0) <= (d["value_sum"] == 0.0), n


def task_of(s: TableSearcher) -> Flaky:
    """The table problem a searcher runs on (under a strategy's view of it, the view's task)."""
    return getattr(s.problem, "task", s.problem)


def through_json(tree: ThoughtTree, prob: TableProblem) -> ThoughtTree:
    data = json.loads(json.dumps(tree.to_json(prob.state_to_json)))
    return ThoughtTree.from_json(data, prob.state_from_json)


@pytest.fixture(scope="module")
def baseline():
    """The uninterrupted run of each strategy: (searcher, result, problem calls)."""
    out = {}
    for name, make, _, opts in STRATEGIES:
        prob = problem(opts)
        s = searcher(prob, make())
        out[name] = (s, s.solve(""), prob.calls)
    return out


def base_of(baseline, make):
    return baseline[IDS[[s[1] for s in STRATEGIES].index(make)]]


# -- contracts ------------------------------------------------------------------------------------
@params
def test_holds_configuration_only(baseline, make, batch, opts):
    strategy = make()
    assert dataclasses.is_dataclass(strategy)
    assert set(vars(strategy)) == {f.name for f in dataclasses.fields(strategy)}
    assert all(f.kw_only for f in dataclasses.fields(strategy))
    s, _, _ = base_of(baseline, make)
    assert dataclasses.asdict(s.strategy) == dataclasses.asdict(strategy)  # the run changed nothing on it


@params
def test_same_seed_same_tree(baseline, make, batch, opts):
    s0, r0, _ = base_of(baseline, make)
    s = searcher(problem(opts), make())
    r = s.solve("")
    assert len(r.tree) > 4 and signature(r.tree) == signature(r0.tree)
    assert (r.best, r.answer) == (r0.best, r0.answer)
    assert s.log == s0.log


@params
def test_batches_honoured_and_no_operation_repeated(baseline, make, batch, opts):
    s, r, _ = base_of(baseline, make)
    expanded, scored = set(), set()
    for kind, nodes in s.log:
        assert nodes and len(nodes) == len(set(nodes)), (kind, nodes)
        if kind == "expand":
            assert len(nodes) <= batch, nodes
            assert not expanded & set(nodes), f"re-expanded {expanded & set(nodes)}"
            expanded |= set(nodes)
        else:  # nothing is valued twice
            assert not scored & set(nodes), f"re-evaluated {scored & set(nodes)}"
            scored |= set(nodes)
    assert expanded == {n for n in r.tree.graph if is_expanded(r.tree, n)}


@params
def test_nothing_half_done(baseline, make, batch, opts):
    s, r, _ = base_of(baseline, make)
    check_complete(r.tree, problem(opts), s.problem)
    if isinstance(s.strategy, MCTS):
        assert r.tree.node(0)["visits"] == s.strategy.iterations


@params
def test_running_again_is_harmless(make, batch, opts):
    s = searcher(problem(opts), make())
    r = s.solve("")
    before, calls, log = signature(r.tree), task_of(s).calls, list(s.log)
    assert s.strategy.run(s) == r.best
    assert signature(s.tree) == before and s.log == log  # no expand / evaluate call at all
    assert task_of(s).calls == calls


def interrupted_then_resumed(make, opts, fail_at: int, seed: int = 7, via_json: bool = False):
    prob = problem(opts, seed)
    prob.fail_at = fail_at
    s = searcher(prob, make())
    with pytest.raises(Interrupted):
        s.solve("")
    check_complete(s.tree, prob, s.problem)  # the interruption left nothing half-done
    prob.fail_at = None
    tree = through_json(s.tree, prob) if via_json else s.tree
    return s.resume(tree)  # same searcher settings


@params
@pytest.mark.parametrize("where", [0.02, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9, 0.99])
def test_resume_gives_the_uninterrupted_tree(baseline, make, batch, opts, where):
    _, r0, total = base_of(baseline, make)
    fail_at = max(1, round(where * total))
    r = interrupted_then_resumed(make, opts, fail_at, via_json=where in (0.3, 0.75))
    assert signature(r.tree) == signature(r0.tree)
    assert (r.best, r.answer, r.solved) == (r0.best, r0.answer, r0.solved)


@params
@settings(max_examples=4, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), where=st.floats(0.0, 1.0))
def test_resume_equality_on_random_trees(make, batch, opts, seed, where):
    prob = problem(opts, seed)
    r0 = searcher(prob, make()).solve("")
    fail_at = 1 + int(where * (prob.calls - 1))
    r = interrupted_then_resumed(make, opts, fail_at, seed=seed)
    assert signature(r.tree) == signature(r0.tree) and r.best == r0.best


def test_strategies_and_their_contracts_need_no_torch():
    """In a fresh interpreter, `strategies` and the contracts (run again: harmless; interrupted and
    resumed: the uninterrupted tree) run for every strategy without importing torch."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = """
import sys
import strategies
import test_strategy_contracts as c
for _, make, batch, opts in c.STRATEGIES:
    c.test_running_again_is_harmless(make, batch, opts)
    r0 = c.searcher(c.problem(opts), make()).solve("")
    r = c.interrupted_then_resumed(make, opts, fail_at=5)
    assert c.signature(r.tree) == c.signature(r0.tree)
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
"""
    tests = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(
        [
            str(tests.parent),
            str(tests),
            str(Path(__file__).resolve().parent),
            os.environ.get("PYTHONPATH", ""),
        ]
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tests.parent,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
