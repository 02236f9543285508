"""Persistence: SearchResult.save / load keep everything but KV handles (thoughts, states, scores,
statuses, MCTS visits and value sums, stats, config); files are written atomically; a truncated,
edited or damaged file raises SaveFileError and nothing is half-loaded."""

from __future__ import annotations

import json
import os
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_problems import (
    Words,
    one_thread,  # noqa: F401  (an autouse fixture)
    tree_data,
)

from strategies import MCTS
from treesearch import SaveFileError, Searcher, SearchResult, ThoughtTree
from treesearch.tasks.game24 import Game24, Game24State


@pytest.fixture(scope="module")
def mcts_result(tiny_lm):
    return Searcher(tiny_lm, Words(), MCTS(iterations=6), progress=False).solve("cats")


def test_round_trip_keeps_everything(mcts_result, tmp_path):
    res, problem = mcts_result, Words()
    assert any(res.tree.node(n)["visits"] > 1 for n in res.tree.graph)  # MCTS statistics to keep
    path = res.save(tmp_path / "r.json")
    back = SearchResult.load(path, problem)
    assert tree_data(back, problem) == tree_data(res, problem)
    for n, d in res.tree.graph.nodes(data=True):
        b = back.tree.node(n)
        assert b["state"] == d["state"] and isinstance(b["state"], tuple)
        assert {
            k: b[k] for k in ("thought", "score", "status", "visits", "value_sum", "terminal", "solved")
        } == {k: d[k] for k in ("thought", "score", "status", "visits", "value_sum", "terminal", "solved")}
        assert b["kv"] is None
    assert (back.best, back.answer, back.solved, back.status, back.error) == (
        res.best,
        res.answer,
        res.solved,
        "complete",
        None,
    )
    assert back.stats == res.stats and back.config == res.config
    assert back.tree.meta == res.tree.meta
    assert list(back.tree.graph.edges) == list(res.tree.graph.edges)


def test_round_trip_of_exact_game24_states(tmp_path):
    p = Game24()
    tree = ThoughtTree()
    root = tree.add_root(p.initial_state("4 5 6 10"))
    kid = tree.add_child(
        root,
        "10 / 4 = 5/2 (left: 5/2 5 6)",
        Game24State(
            puzzle=(4, 5, 6, 10), numbers=(Fraction(5, 2), Fraction(5), Fraction(6)), steps=("10 / 4 = 5/2",)
        ),
    )
    tree.node(kid)["score"] = 0.125
    res = SearchResult(tree=tree, best=kid, answer=None, solved=False, problem=p)
    back = SearchResult.load(res.save(tmp_path / "g.json"), p)
    assert back.tree.node(kid)["state"] == tree.node(kid)["state"]
    assert back.tree.node(kid)["state"].numbers[0] == Fraction(5, 2)


def saved_bytes(mcts_result, tmp_path) -> bytes:
    return mcts_result.save(tmp_path / "orig.json").read_bytes()


def test_every_truncation_is_refused(mcts_result, tmp_path):
    raw = saved_bytes(mcts_result, tmp_path)
    cut = tmp_path / "cut.json"
    for n in sorted(
        {0, 1, 2, 10, len(raw) // 3, len(raw) // 2, len(raw) - 3, len(raw) - 2}
        | set(range(0, len(raw) - 1, 997))
    ):
        cut.write_bytes(raw[:n])
        with pytest.raises(SaveFileError, match="empty|not valid JSON|nothing was loaded"):
            SearchResult.load(cut, Words())


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(data=st.data())
def test_any_single_byte_change_is_refused_or_harmless(mcts_result, tmp_path, data):
    raw = saved_bytes(mcts_result, tmp_path)
    pos = data.draw(st.integers(0, len(raw) - 2))
    new = data.draw(st.integers(0, 255).filter(lambda b: b != raw[pos]))
    bad = tmp_path / "bad.json"
    bad.write_bytes(raw[:pos] + bytes([new]) + raw[pos + 1 :])
    try:
        back = SearchResult.load(bad, Words())
    except SaveFileError:
        return
    # a change that decodes to the very same JSON (e.g. an escape's hex case) must load the same search
    assert tree_data(back, Words()) == tree_data(mcts_result, Words())


def test_checksum_catches_a_changed_score(mcts_result, tmp_path):
    path = mcts_result.save(tmp_path / "r.json")
    doc = json.loads(path.read_text())
    doc["result"]["tree"]["nodes"][1]["score"] += 1e-9
    path.write_text(json.dumps(doc))
    with pytest.raises(SaveFileError, match="failed its checksum"):
        SearchResult.load(path, Words())


@pytest.mark.parametrize(
    "mutate,pattern",
    [
        (lambda d: d["nodes"].pop(), "does not join two known nodes"),
        (lambda d: d["nodes"][1].update(id=7), "ids must be 0"),
        (lambda d: d["nodes"][2].update(status="weird"), "status 'weird'"),
        (lambda d: d["nodes"][2].update(depth=5), "node 2 has depth 5"),
        (lambda d: d["nodes"][2].update(visits="3"), "attribute 'visits'"),
        (lambda d: d["nodes"][2].update(score="high"), "score is 'high'"),
        (lambda d: d["nodes"][2].pop("state"), "node 2 has no state"),
        (lambda d: d["links"].append({"source": 2, "target": 1}), "one parent with a smaller id"),
        (lambda d: d["links"].append({"source": 0, "target": 99}), "does not join two known nodes"),
        (lambda d: d["links"].pop(0), "have no parent"),
        (lambda d: d.update(nodes="x"), "expected node-link JSON"),
        (lambda d: d["graph"].update(format="treesearch-tree/999"), "format"),
    ],
)
def test_tree_files_are_checked_before_building(mcts_result, tmp_path, mutate, pattern):
    data = mcts_result.tree.to_json(Words().state_to_json)
    mutate(data)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SaveFileError, match=pattern):
        ThoughtTree.load(path, Words().state_from_json)


def test_state_from_json_failure_is_a_clear_error(mcts_result, tmp_path):
    path = mcts_result.save(tmp_path / "r.json")
    with pytest.raises(SaveFileError, match="state of node 0 could not be rebuilt"):
        SearchResult.load(path, Game24())  # another problem's states


def test_a_crash_mid_save_keeps_the_old_file(mcts_result, tmp_path, monkeypatch):
    path = mcts_result.save(tmp_path / "r.json")
    before = path.read_bytes()

    def crash(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        SearchResult(tree=ThoughtTree(), best=None, answer=None, solved=False).save(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # no stray temporary


def test_other_files_are_refused_clearly(mcts_result, tmp_path):
    tree_only = tmp_path / "tree.json"
    mcts_result.tree.save(tree_only)
    with pytest.raises(SaveFileError, match="use ThoughtTree.load"):
        SearchResult.load(tree_only)
    with pytest.raises(SaveFileError, match="does not exist"):
        SearchResult.load(tmp_path / "missing.json")
