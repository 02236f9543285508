"""The command line (`treesearch.cli.main`): `--help` loads no torch, `solve` writes its JSON, and
Ctrl-C saves the partial search that `--resume` finishes. A budget below the root prompt is in
tests/cache/test_budget.py; argument errors are in tests/cli/test_cli_errors.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


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


@pytest.mark.parametrize("command", ["calibrate", "bench"])
def test_a_handed_over_command_interrupted_by_ctrl_c_says_so_in_one_line(command, monkeypatch, capsys):
    """Ctrl-C (KeyboardInterrupt in the main thread) anywhere in bench or calibrate: exit 130, one
    line on stderr, no traceback."""
    from treesearch.cli import main as cli

    def ctrl_c(argv):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.HANDED_OVER, command, ctrl_c)
    assert cli.main([command, "--model", "tiny"]) == 130
    assert capsys.readouterr().err == f"treesearch: {command} interrupted\n"


def test_step_tokens_reaches_the_engine_and_changes_no_result(tmp_path, monkeypatch, capsys):
    """`--step-tokens N` prefills prompts in parts of N tokens; the tree and answer are those of the
    default (2048, each prompt in one part)."""
    from treesearch.cli import main as cli
    from treesearch.cli.checks import search_config
    from treesearch.cli.main import build_parser

    solve = ["solve", "game24", "4 5 6 10", "--model", "tiny", "--no-progress", "--breadth", "2"]
    assert search_config(build_parser().parse_args(solve)).step_tokens == 2048
    assert search_config(build_parser().parse_args([*solve, "--step-tokens", "5"])).step_tokens == 5
    monkeypatch.chdir(tmp_path)
    assert cli.main([*solve, "--json", "whole.json"]) == 0
    assert cli.main([*solve, "--step-tokens", "5", "--json", "parts.json"]) == 0
    whole, parts = (json.loads((tmp_path / f).read_text()) for f in ("whole.json", "parts.json"))
    assert parts["tree"] == whole["tree"] and parts["answer"] == whole["answer"]
    assert parts["stats"]["prefill_tokens"] == whole["stats"]["prefill_tokens"]
    capsys.readouterr()
    assert cli.main([*solve, "--step-tokens", "0"]) == 2
    assert capsys.readouterr().err == (
        "treesearch: error: --step-tokens 0: use a positive number of tokens such as 2048\n"
    )
