"""Each strategy on hand-built trees whose answers are known (strategies.testing.TableProblem):
exact expansion order, beam contents per depth, DFS pruning and backtracking, MCTS visit counts
and value sums after N iterations computed by hand below. The tiny model runs every expansion; the
table decides the children, so the tree is known exactly. Plus an end-to-end run of each strategy
on Game of 24 with the default model, exact KV sharing checked lossless against sharing off, and
the CLI's --strategy flag.
"""

from __future__ import annotations

import math

import pytest
from recording import RecordingSearcher

from strategies import BFS, DFS, MCTS, Beam
from strategies.testing import TableProblem, TableSearcher
from treesearch.common.config import RKSCConfig
from treesearch.common.errors import ConfigError
from treesearch.search.searcher import Searcher


def solve(lm, problem, strategy):
    s = RecordingSearcher(lm, problem, strategy, progress=False)
    return s, s.solve("")


def states(tree, nodes):
    return [tree.node(n)["state"] for n in nodes]


def by_status(tree, status):
    return states(tree, tree.nodes_with(status=status))


# T1, depth 3; the leaves (depth 3) are terminal, "aba" is the solution.
#   root
#   +- a .6 -+- aa .5 --- aaa .1
#   |        +- ab .8 -+- aba 1.0 (solved)
#   |                  +- abb .3
#   +- b .9 -+- ba .2 --- baa .6
#   |        +- bb .4 --- bba .7
#   +- c .3 --- ca .95 -- caa .9
T1 = dict(
    children={
        "": ["a", "b", "c"],
        "a": ["aa", "ab"],
        "b": ["ba", "bb"],
        "c": ["ca"],
        "aa": ["aaa"],
        "ab": ["aba", "abb"],
        "ba": ["baa"],
        "bb": ["bba"],
        "ca": ["caa"],
    },
    values={
        "a": 0.6,
        "b": 0.9,
        "c": 0.3,
        "aa": 0.5,
        "ab": 0.8,
        "ba": 0.2,
        "bb": 0.4,
        "ca": 0.95,
        "aaa": 0.1,
        "aba": 1.0,
        "abb": 0.3,
        "baa": 0.6,
        "bba": 0.7,
        "caa": 0.9,
    },
    terminal={"aaa", "aba", "abb", "baa", "bba", "caa"},
    solved={"aba"},
    max_depth=3,
)


def t1(**kw) -> TableProblem:
    return TableProblem(**{**T1, **kw})


# -- BFS ------------------------------------------------------------------------------------------
def test_bfs_keeps_the_top_breadth_children_per_depth(tiny_lm):
    s, r = solve(tiny_lm, t1(), BFS(breadth=2))
    tree = r.tree
    # depth 1: a(1) .6, b(2) .9, c(3) .3 -> keep b, a. depth 2: b's ba(4) .2, bb(5) .4, a's aa(6) .5,
    # ab(7) .8 -> keep ab, aa. depth 3: ab's aba(8) 1.0, abb(9) .3, aa's aaa(10) .1 -> keep aba, abb.
    assert s.ops("expand") == [[0], [2, 1], [7, 6]]
    assert s.ops("evaluate") == [[1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
    assert states(tree, range(len(tree))) == ["", "a", "b", "c", "ba", "bb", "aa", "ab", "aba", "abb", "aaa"]
    assert by_status(tree, "pruned") == ["c", "ba", "bb", "aaa"]
    assert by_status(tree, "solution") == ["aba"]
    assert by_status(tree, "frontier") == ["abb"]
    assert (r.best, r.answer, r.solved) == (8, "aba", True)


def test_bfs_rejects_a_zero_breadth():
    with pytest.raises(ConfigError, match="breadth=0"):
        BFS(breadth=0)


# -- Beam -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "aggregate, beams, pruned",
    [
        # last: like BFS (scores of the node itself): [b, a] -> [ab, aa] -> [aba, abb]
        ("last", [[0], [2, 1], [7, 6]], ["c", "ba", "bb", "aaa"]),
        # mean: depth 2 ba (.9+.2)/2=.55, bb .65, aa .55, ab .7 -> [ab, bb];
        #       depth 3 aba (.6+.8+1)/3=.8, abb .567, bba (.9+.4+.7)/3=.667 -> [aba, bba], solved: stop
        ("mean", [[0], [2, 1], [7, 5]], ["c", "ba", "aa", "abb"]),
        # min: depth 2 ba .2, bb .4, aa .5, ab .6 -> [ab, aa]; depth 3 aba .6, abb .3, aaa .1 -> [aba, abb]
        ("min", [[0], [2, 1], [7, 6]], ["c", "ba", "bb", "aaa"]),
        # product: depth 2 ba .18, bb .36, aa .30, ab .48 -> [ab, bb];
        #          depth 3 aba .48, abb .144, bba .252 -> [aba, bba]
        ("product", [[0], [2, 1], [7, 5]], ["c", "ba", "aa", "abb"]),
    ],
)
def test_beam_contents_per_depth_follow_the_aggregate(tiny_lm, aggregate, beams, pruned):
    s, r = solve(tiny_lm, t1(), Beam(width=2, aggregate=aggregate))
    assert s.ops("expand") == beams
    assert by_status(r.tree, "pruned") == pruned
    assert by_status(r.tree, "solution") == ["aba"]
    assert (r.answer, r.solved) == ("aba", True)


def test_beam_path_scores_by_hand(tiny_lm):
    _, r = solve(tiny_lm, t1(), Beam(width=2, aggregate="mean"))
    tree, aba = r.tree, 8
    assert tree.node(aba)["state"] == "aba"
    want = {"last": 1.0, "mean": (0.6 + 0.8 + 1.0) / 3, "min": 0.6, "product": 0.6 * 0.8 * 1.0}
    for agg, v in want.items():
        assert Beam(aggregate=agg).path_score(tree, aba) == pytest.approx(v, abs=1e-12)
    assert Beam().path_score(tree, tree.root) == -math.inf


def test_beam_stops_at_a_solution_unless_told_not_to(tiny_lm):
    # T2: x is an unsolved answer at depth 1, y leads to the solution ya, z to zz.
    table = dict(
        children={"": ["x", "y", "z"], "y": ["ya"], "z": ["za"], "za": ["zaa"]},
        values={"x": 0.9, "y": 0.5, "z": 0.45, "ya": 1.0, "za": 0.6, "zaa": 0.2},
        terminal={"x", "ya", "zaa"},
        solved={"ya"},
        max_depth=3,
    )
    s, r = solve(tiny_lm, TableProblem(**table), Beam(width=2))
    # depth 1: keep x(1), y(2); x is finished, only y is expanded; ya(4) solved -> stop.
    assert s.ops("expand") == [[0], [2]]
    assert (r.answer, by_status(r.tree, "pruned")) == ("ya", ["z"])
    s, r = solve(tiny_lm, TableProblem(**table), Beam(width=3, stop_on_solution=False))
    # width 3 keeps z(3) too: depth 2 children ya(4) 1.0, za(5) .6; depth 3 expands za only.
    assert s.ops("expand") == [[0], [2, 3], [5]]
    assert (r.answer, r.solved) == ("ya", True)


def test_beam_rejects_unknown_aggregate():
    with pytest.raises(ConfigError, match="aggregate='max'"):
        Beam(aggregate="max")


# -- DFS ------------------------------------------------------------------------------------------
def test_dfs_prunes_below_threshold_and_backtracks(tiny_lm):
    s, r = solve(tiny_lm, t1(), DFS(threshold=0.45))
    # root -> a(1) .6, b(2) .9, c(3) .3 (pruned); visit b: ba(4) .2, bb(5) .4 both pruned ->
    # backtrack to a: aa(6) .5, ab(7) .8; visit ab: aba(8) 1.0, abb(9) .3 (pruned); aba solved: stop.
    assert s.ops("expand") == [[0], [2], [1], [7]]
    assert s.ops("evaluate") == [[1, 2, 3], [4, 5], [6, 7], [8, 9]]
    assert by_status(r.tree, "pruned") == ["c", "ba", "bb", "abb"]
    assert by_status(r.tree, "solution") == ["aba"]
    assert (r.best, r.answer, r.solved) == (8, "aba", True)


@pytest.mark.parametrize(
    "budget, expansions, answer",
    [
        # root, b, then b's best child bb (.4 > ba .2); bba(6) is an unsolved answer; ba would be the 4th.
        (3, [[0], [2], [5]], "bba"),
        # ... then ba(4) -> baa(7), backtrack to a(1) -> aa(8), ab(9); ab would be the 6th expansion.
        (5, [[0], [2], [5], [4], [1]], "bba"),
        # ... ab(9) -> aba(10) solved.
        (6, [[0], [2], [5], [4], [1], [9]], "aba"),
    ],
)
def test_dfs_state_budget_counts_expansions(tiny_lm, budget, expansions, answer):
    s, r = solve(tiny_lm, t1(), DFS(max_states=budget))
    assert s.ops("expand") == expansions
    assert r.answer == answer
    assert by_status(r.tree, "pruned") == []


def test_dfs_respects_the_depth_limit(tiny_lm):
    s, r = solve(tiny_lm, t1(), DFS(max_depth=1))
    assert s.ops("expand") == [[0]]
    assert (r.answer, states(r.tree, [r.best])) == (None, ["b"])


# -- MCTS -----------------------------------------------------------------------------------------
# M, depth 2, values in [0, 1]:   root -+- a .2 -+- a1 1.0 (solved)
#                                       |        +- a2 0.0
#                                       +- b .6 --- b1 .4
M = dict(
    children={"": ["a", "b"], "a": ["a1", "a2"], "b": ["b1"]},
    values={"a": 0.2, "b": 0.6, "a1": 1.0, "a2": 0.0, "b1": 0.4},
    terminal={"a1", "a2", "b1"},
    solved={"a1"},
    max_depth=2,
)


def stats(tree):
    """{state: (N, W)} for every node."""
    return {
        d["state"]: (d["visits"], pytest.approx(d["value_sum"], abs=1e-9))
        for _, d in tree.graph.nodes(data=True)
    }


def test_mcts_uct_visits_and_values_by_hand(tiny_lm):
    s, r = solve(tiny_lm, TableProblem(**M), MCTS(iterations=6, exploration=1.0))
    # UCT(c) = Q(c) + sqrt(ln N(parent) / N(c)), unvisited first (ties by value):
    # 1. root opened: a(1), b(2) valued; both unvisited, b has the higher value -> G = V(b) = .6
    # 2. a unvisited -> G = .2                                        root N=2 W=.8
    # 3. a .2+sqrt(ln2)=1.033, b .6+.833=1.433 -> b; b opened: b1(3) -> G = .4
    # 4. ln3=1.0986: a .2+1.048=1.248, b .5+.741=1.241 -> a; a opened: a1(4), a2(5);
    #    a1 (higher value) -> G = 1.0, a1 marked solution
    # 5. ln4: a .6+.833=1.433, b .5+.833=1.333 -> a; a2 unvisited -> G = 0
    # 6. ln5=1.609: a .4+.732=1.132, b .5+.897=1.397 -> b -> b1 (terminal) -> G = .4
    assert stats(r.tree) == {
        "": (6, 2.6),
        "a": (3, 1.2),
        "b": (3, 1.4),
        "a1": (1, 1.0),
        "a2": (1, 0.0),
        "b1": (2, 0.8),
    }
    assert s.ops("expand") == [[0], [2], [1]]
    assert s.ops("evaluate") == [[1, 2], [3], [4, 5]]
    assert by_status(r.tree, "solution") == ["a1"]
    assert r.answer == "b1"  # most-visited terminal
    _, r = solve(tiny_lm, TableProblem(**M), MCTS(iterations=6, exploration=1.0, answer="value"))
    assert r.answer == "a1"


def test_mcts_puct_uses_priors_by_hand(tiny_lm):
    priors = {"a": 0.7, "b": 0.3, "a1": 0.5, "a2": 0.5, "b1": 1.0}
    s, r = solve(tiny_lm, TableProblem(**M, priors=priors), MCTS(iterations=6, exploration=2.0))
    # PUCT(c) = q(c) + 2 P(c) sqrt(N(parent)) / (1 + N(c)), q = 0 when unvisited:
    # 1. N(root)=0: both 0, a has the higher prior -> G = .2          (UCT would take b first)
    # 2. a .2+1.4/2=.9, b .6 -> a; a opened: a1 = a2 = 1.0, a1 higher value -> G = 1
    # 3. a .6+1.4*1.414/3=1.260, b .6*1.414=.849 -> a; a1 1+1.414/2=1.707, a2 1.414 -> a1, G = 1
    # 4. a .733+1.4*1.732/4=1.340, b 1.039 -> a; a1 1+1.732/3=1.577, a2 1.732 -> a2, G = 0
    # 5. a .55+1.4*2/5=1.11, b .6*2=1.2 -> b (unvisited leaf), G = .6
    # 6. a .55+1.4*2.236/5=1.176, b .6+.6*2.236/2=1.271 -> b; b opened: b1 -> G = .4
    assert stats(r.tree) == {
        "": (6, 3.2),
        "a": (4, 2.2),
        "b": (2, 1.0),
        "a1": (2, 2.0),
        "a2": (1, 0.0),
        "b1": (1, 0.4),
    }
    assert s.ops("expand") == [[0], [1], [2]]
    assert r.answer == "a1"


def test_mcts_rollout_visits_and_values_by_hand(tiny_lm):
    s, r = solve(tiny_lm, TableProblem(**M), MCTS(iterations=4, evaluation="rollout"))
    # Children are not valued on expansion; a leaf's return is the value at the end of a rollout
    # through first children.
    # 1. root opened: a(1), b(2), unscored -> a (lower id); rollout a -> a1(3): G = 1.0
    # 2. b unvisited -> rollout b -> b1(5): G = .4
    # 3. a 1+sqrt(ln2)=1.833, b .4+.833=1.233 -> a; a1, a2 unvisited, a1 has a score -> a1: G = 1.0
    # 4. a 1+sqrt(ln3/2)=1.741, b .4+1.048=1.448 -> a; a1 1+.833, a2 unvisited -> a2(4): G = 0
    assert stats(r.tree) == {
        "": (4, 2.4),
        "a": (3, 2.0),
        "b": (1, 0.4),
        "a1": (1, 1.0),
        "a2": (1, 0.0),
        "b1": (0, 0.0),
    }
    assert s.ops("expand") == [[0], [1], [2]]
    assert s.ops("evaluate") == [[3], [5], [4]]


def test_mcts_exploration_is_scale_free_through_value_range(tiny_lm):
    ten = dict(M, values={k: 10 * v for k, v in M["values"].items()})
    _, r1 = solve(tiny_lm, TableProblem(**M), MCTS(iterations=6))
    _, r10 = solve(tiny_lm, TableProblem(**ten, value_range=(0.0, 10.0)), MCTS(iterations=6))
    for n in r1.tree.graph:
        d1, d10 = r1.tree.node(n), r10.tree.node(n)
        assert (d1["state"], d1["visits"]) == (d10["state"], d10["visits"])
        assert d10["value_sum"] == pytest.approx(10 * d1["value_sum"], abs=1e-9)


def test_mcts_without_a_terminal_answers_along_most_visited_children(tiny_lm):
    _, r = solve(tiny_lm, TableProblem(**M), MCTS(iterations=2))
    # a and b visited once each; b has the higher mean; b has no visited child.
    assert states(r.tree, [r.best]) == ["b"] and r.answer is None


def test_mcts_stop_on_solution(tiny_lm):
    _, r = solve(tiny_lm, TableProblem(**M), MCTS(iterations=50, stop_on_solution=True))
    assert r.tree.node(0)["visits"] == 4 and r.answer == "a1"  # the 4th iteration found a1 (see above)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"iterations": 0}, "iterations=0"),
        ({"exploration": -1}, "exploration"),
        ({"evaluation": "sim"}, "evaluation"),
        ({"answer": "best"}, "answer"),
    ],
)
def test_mcts_rejects_bad_settings(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        MCTS(**kwargs)


@pytest.mark.parametrize("seed", [7, 11])
def test_table_searcher_builds_the_searchers_tree(tiny_lm, seed):
    """The model-free SearchOps the contract tests run on (`TableSearcher`) gives each contract
    strategy exactly the tree, answer and operation batches that the real Searcher gives."""
    from test_strategy_contracts import STRATEGIES, TEXT_PARSED, signature

    from treesearch.core.ops import SearchOps

    for name, make, _, opts in STRATEGIES:
        if name in TEXT_PARSED:  # its children come from the model's text, not the table
            continue
        real = RecordingSearcher(tiny_lm, TableProblem.random(seed, **opts), make(), progress=False)
        table = TableSearcher(TableProblem.random(seed, **opts), make())
        assert isinstance(real, SearchOps) and isinstance(table, SearchOps)
        r, t = real.solve(""), table.solve("")
        no_text = (
            [x[:-1] for x in signature(r.tree)],
            [x[:-1] for x in signature(t.tree)],
        )  # generations aside
        assert no_text[0] == no_text[1] and len(r.tree) > 4
        assert (r.best, r.answer, r.solved) == (t.best, t.answer, t.solved)
        assert real.log == table.log


def test_strategies_are_keyword_only():
    for cls in (BFS, Beam, MCTS, DFS):
        with pytest.raises(TypeError):
            cls(3)


# -- CLI ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, cls", [("bfs", BFS), ("beam", Beam), ("mcts", MCTS), ("dfs", DFS)])
def test_cli_registry_builds_each_strategy(name, cls):
    from treesearch.cli.checks import search_strategy
    from treesearch.cli.main import build_parser
    from treesearch.cli.strategy_flags import STRATEGIES

    given = {
        "bfs": ["--breadth", "3"],
        "beam": ["--breadth", "3"],
        "mcts": ["--iterations", "7", "--exploration", "0.5"],
        "dfs": ["--threshold", "1.5", "--max-states", "9"],
    }[name]
    args = build_parser().parse_args(
        ["solve", "game24", "4 5 6 10", "--strategy", name, "--depth", "2", *given]
    )
    strategy = search_strategy(args)
    assert type(strategy) is cls and name in STRATEGIES
    want = {
        "bfs": {"breadth": 3},
        "beam": {"width": 3},
        "mcts": {"iterations": 7, "exploration": 0.5},
        "dfs": {"threshold": 1.5, "max_states": 9},
    }[name]
    assert {k: getattr(strategy, k) for k in want} == want and strategy.max_depth == 2


@pytest.mark.parametrize("name", ["bfs", "beam", "mcts", "dfs", "sc"])
def test_cli_solve_runs_each_strategy(name, capsys, monkeypatch, tiny_lm):
    from treesearch.cli.main import main

    monkeypatch.setattr(
        "treesearch.models.load.load_model", lambda *a, **k: tiny_lm
    )  # the session's tiny model
    assert (
        main(
            [
                "solve",
                "game24",
                "4 5 6 10",
                "--model",
                "tiny",
                "--strategy",
                name,
                *{"mcts": ["--iterations", "2"], "dfs": ["--max-states", "2"], "sc": ["--samples", "2"]}.get(
                    name, []
                ),
                "--no-progress",
                "--stats",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "solved: " in out and "prefill_tokens=" in out


# -- end to end, default model ----------------------------------------------------------------------
E2E = [
    ("bfs", lambda: BFS(breadth=2, max_depth=2)),
    ("beam", lambda: Beam(width=2, max_depth=2)),
    ("mcts", lambda: MCTS(iterations=3, max_depth=2)),
    ("dfs", lambda: DFS(max_states=2)),
]


@pytest.mark.real_model
@pytest.mark.parametrize("name, make", E2E, ids=[n for n, _ in E2E])
def test_game24_with_the_default_model_is_lossless(real_lm, name, make):
    from treesearch.tasks import Game24

    runs = {}
    for kv in ("exact", "off"):
        problem = Game24(max_new_tokens=40)
        runs[kv] = Searcher(real_lm, problem, make(), RKSCConfig(kv_sharing=kv), progress=False).solve(
            "4 5 6 10"
        )
    exact, off = runs["exact"].tree, runs["off"].tree
    assert len(exact) == len(off) > 1
    for n in exact.graph:
        e, o = exact.node(n), off.node(n)
        assert (e["thought"], e["state"], e["status"], e["visits"]) == (
            o["thought"],
            o["state"],
            o["status"],
            o["visits"],
        )
        assert (e["score"] is None) == (o["score"] is None)
        if e["score"] is not None:
            assert e["score"] == pytest.approx(o["score"], abs=1e-4)
            assert e["value_sum"] == pytest.approx(o["value_sum"], abs=1e-4)
    assert runs["exact"].best == runs["off"].best
    assert runs["exact"].stats["reused_tokens"] > 0 == runs["off"].stats["reused_tokens"]
    assert runs["exact"].stats["prefill_tokens"] < runs["off"].stats["prefill_tokens"]
