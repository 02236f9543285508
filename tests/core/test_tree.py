"""ThoughtTree persistence, the text view, and the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from treesearch import ThoughtTree
from treesearch.common.errors import TreeSearchError


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


def test_truncated_file_is_a_clear_error(tmp_path):
    path = tmp_path / "tree.json"
    _small_tree().save(path)
    path.write_text(path.read_text()[:50])
    with pytest.raises(TreeSearchError, match="not valid JSON"):
        ThoughtTree.load(path)


def test_text_view_shows_status_score_and_thought():
    view = _small_tree().text_view()
    assert "[ ] #1  2.50 step a" in view
    assert "[x] #2" in view


def test_help_does_not_import_torch():
    code = (
        "import sys; from treesearch.cli.main import main\ntry:\n main(['--help'])\n"
        "except SystemExit: pass\nprint('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False")


def test_solve_with_tiny_model_writes_json(tmp_path):
    path = tmp_path / "a.json"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "treesearch.cli.main",
            "solve",
            "game24",
            "4 5 6 10",
            "--model",
            "tiny",
            "--no-progress",
            "--json",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "solved:" in out.stdout and "stats:" in out.stdout
    data = json.loads(path.read_text())
    assert set(data) >= {"answer", "solved", "stats", "tree"}
    assert data["tree"]["nodes"][0]["state"]["puzzle"] == [4, 5, 6, 10]
    assert {"thought", "state", "depth", "score", "status"} <= set(data["tree"]["nodes"][0])


def test_solve_with_a_budget_below_the_root_prompt_fails_in_one_line_naming_the_minimum():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "treesearch.cli.main",
            "solve",
            "game24",
            "4 5 6 10",
            "--model",
            "tiny",
            "--no-progress",
            "--cache-budget",
            "1000",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("treesearch: error: cache_budget=1000 bytes cannot run this call")
    assert "raise --cache-budget to at least" in out.stderr


def test_solve_interrupted_by_ctrl_c_saves_the_partial_search_and_resume_finishes_it(
    tmp_path, monkeypatch, capsys
):
    from treesearch.cli import main as cli
    from treesearch.search.searcher import Searcher

    monkeypatch.chdir(tmp_path)
    argv = [
        "solve",
        "gsm8k",
        "Tom has 3 apples and buys 4 more. How many apples does he have?",
        "--model",
        "tiny",
        "--no-progress",
        "--breadth",
        "2",
    ]
    assert cli.main(argv + ["--json", "full.json"]) == 0
    full = json.loads((tmp_path / "full.json").read_text())
    evaluate, calls = Searcher.evaluate, []

    def interrupted(self, nodes):
        calls.append(nodes)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return evaluate(self, nodes)

    monkeypatch.setattr(Searcher, "evaluate", interrupted)
    capsys.readouterr()
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert "treesearch: error: interrupted" in err and "--resume treesearch-partial.json" in err
    monkeypatch.setattr(Searcher, "evaluate", evaluate)
    assert cli.main(argv + ["--resume", "treesearch-partial.json", "--json", "resumed.json"]) == 0
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    sig = lambda data: [(n["id"], n["thought"], n["status"]) for n in data["tree"]["nodes"]]  # noqa: E731
    assert len(full["tree"]["nodes"]) > 3 and sig(resumed) == sig(full)
    for a, b in zip(
        full["tree"]["nodes"], resumed["tree"]["nodes"]
    ):  # scores equal up to float reassociation
        assert (a["score"] is None and b["score"] is None) or abs(a["score"] - b["score"]) <= 1e-4
