"""What a report records about its run (the benchmark pages' captions): the date in UTC, the
checkout's commit (with `+` when tracked files differ from it) and the load average at the start."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

from treesearch.common.provenance import commit, record

ROOT = Path(__file__).resolve().parents[2]


def test_record_gives_the_utc_minute_the_commit_and_the_load():
    r = record()
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC", r["date"])
    assert r["load"] is None or r["load"] >= 0
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=9", "HEAD"], capture_output=True, text=True
    )
    if head.returncode == 0:
        assert r["commit"].rstrip("+") == head.stdout.strip()


def test_a_folder_outside_git_has_no_commit(tmp_path):
    assert commit(tmp_path) is None


def test_a_changed_tracked_file_marks_the_commit(tmp_path):
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    clean = commit(tmp_path)
    assert clean is not None and not clean.endswith("+")
    (tmp_path / "b.txt").write_text("untracked\n")  # untracked files do not count
    assert commit(tmp_path) == clean
    (tmp_path / "a.txt").write_text("two\n")
    assert commit(tmp_path) == clean + "+"


def test_the_run_report_holds_the_summary_and_what_ran_where():
    from treesearch.cli.run import run_report
    from treesearch.runs.results_file import summarize

    args = argparse.Namespace(
        task="game24",
        strategy="cot",
        model=None,
        argv=["run", "game24", "--range", "900:902", "--strategy", "cot"],
    )
    rows = [{"solved": True, "status": "complete"}, {"solved": False, "status": "complete"}]
    doc = run_report(
        args, summarize(rows, wall_s=10.0, inputs_run=2), {"date": "d", "commit": "c", "load": 1.0}
    )
    assert doc["solved"] == 1 and doc["searched"] == 2 and doc["inputs_per_hour"] == 720.0
    assert doc["task"] == "game24" and doc["strategy"] == "cot" and doc["model"] == "SmolLM2-135M-Instruct"
    assert doc["command"] == "treesearch run game24 --range 900:902 --strategy cot"
    assert doc["recorded"] == {"date": "d", "commit": "c", "load": 1.0} and doc["machine"]["cpus"] >= 1
