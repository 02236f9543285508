"""ThoughtTree persistence and the text view (the command line's tests are in tests/cli/test_main.py)."""

from __future__ import annotations

import json

import pytest

from treesearch import ThoughtTree
from treesearch.common.errors import SaveFileError, TreeSearchError


def _small_tree() -> ThoughtTree:
    t = ThoughtTree()
    r = t.add_root({"n": 0})
    a = t.add_child(r, "step a", {"n": 1})
    b = t.add_child(r, "step b", {"n": 2})
    t.add_child(a, "step c", {"n": 3})
    t.node(a)["score"] = 2.5
    t.set_status(b, "pruned")
    t.node(a)["kv"] = object()  # never serialised
    return t


def test_json_round_trip_keeps_everything_but_kv(tmp_path):
    t = _small_tree()
    path = tmp_path / "tree.json"
    t.save(path)
    u = ThoughtTree.load(path)
    assert sorted(u.graph.edges) == sorted(t.graph.edges)
    for n in t.graph:
        want = {k: v for k, v in t.node(n).items() if k != "kv"}
        got = {k: v for k, v in u.node(n).items() if k != "kv"}
        assert got == want
        assert u.node(n)["kv"] is None
    assert u.path(3) == [0, 1, 3]


def test_a_tree_file_round_trips_through_state_codecs_and_every_truncation_of_it_is_refused(tmp_path):
    """save/load with the problem's state codecs give back the same tree (MCTS statistics
    included); the file cut at any byte raises SaveFileError (a TreeSearchError) saying it is not
    valid JSON, so nothing half-loads."""
    t = _small_tree()
    t.node(1).update(visits=3, value_sum=1.5)
    to_json, from_json = (lambda s: [s["n"]]), (lambda d: {"n": d[0]})
    path = t.save(tmp_path / "tree.json", to_json)
    assert json.loads(path.read_text())["nodes"][3]["state"] == [3]  # the codec wrote the state
    back = ThoughtTree.load(path, from_json)
    assert back.to_json(to_json) == t.to_json(to_json)
    assert [back.node(n)["state"] for n in back.graph] == [t.node(n)["state"] for n in t.graph]
    raw = path.read_bytes()
    for n in range(len(raw)):
        path.write_bytes(raw[:n])
        with pytest.raises(SaveFileError, match="not valid JSON") as info:
            ThoughtTree.load(path, from_json)
        assert isinstance(info.value, TreeSearchError)


def test_text_view_shows_status_score_and_thought():
    view = _small_tree().text_view()
    assert "[ ] #1  2.50 step a" in view
    assert "[x] #2" in view
