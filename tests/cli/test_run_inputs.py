"""`treesearch run`'s input and summary: a malformed .jsonl line is one error line naming the file's line,
a --range past the end of the data says what ran, the accuracy is over the searched inputs, and counts
read as English."""

from __future__ import annotations

import json
import subprocess

from run_rows import RUN

from treesearch.common.intervals import wilson
from treesearch.runs.results_file import summarize


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(RUN + list(args), capture_output=True, text=True, timeout=600, cwd=cwd)


def test_a_malformed_jsonl_line_is_one_error_line_naming_the_line_of_the_file(tmp_path):
    path = tmp_path / "inputs.jsonl"
    path.write_text('"4 5 6 10"\n\n"1 1 4 6"\n{"a": 1,\n')  # line 4 is cut short; line 2 is blank
    done = run("--inputs", str(path), "--out", str(tmp_path / "out.jsonl"))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"treesearch: error: {path} line 4: not a JSON value (Expecting property name enclosed in double "
        "quotes); write one JSON value per line\n"
    )
    assert not (tmp_path / "out.jsonl").exists()


def test_a_range_past_the_end_of_the_data_says_how_many_rows_there_are_and_what_ran(tmp_path):
    out = tmp_path / "out.jsonl"
    done = run("--range", "1361:1400", "--depth", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[:2] == [
        "run: --range 1361:1400 runs past the end of the game24 test set (1362 rows); running row 1361 only",
        f"run: 1 input, 0 already in {out}, 1 to go, concurrency 16",
    ]
    assert [json.loads(ln)["index"] for ln in out.read_text().splitlines()] == [1361]
    assert "this run: 1 input in " in done.stdout


def test_the_accuracy_is_over_the_searched_inputs_with_the_invalid_ones_beside_it(tmp_path):
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("4 5 6 10\n1 2 3\nfour five six ten\n")
    done = run("--inputs", str(inputs), "--depth", "1", "--out", str(tmp_path / "out.jsonl"))
    assert done.returncode == 0, done.stderr
    low, high = wilson(0, 1)
    assert done.stdout.splitlines()[0] == (
        f"inputs: 3, 2 invalid (not searched); searched 1 (0 failed): solved 0 of 1, accuracy 0.000 "
        f"(95% CI {low:.3f}-{high:.3f})"
    )


def test_summary_counts_searched_inputs_only_in_the_accuracy():
    rows = [
        {"solved": True, "status": "complete"},
        {"solved": False, "status": "failed"},
        {"solved": False, "status": "invalid"},
        {"solved": False, "status": "invalid"},
    ]
    s = summarize(rows)
    assert (s.inputs, s.searched, s.solved, s.failed, s.invalid) == (4, 2, 1, 1, 2)
    assert s.accuracy == 0.5 and (s.accuracy_low, s.accuracy_high) == wilson(1, 2)
    assert s.lines()[0] == (
        "inputs: 4, 2 invalid (not searched); searched 2 (1 failed): solved 1 of 2, accuracy 0.500 "
        f"(95% CI {wilson(1, 2)[0]:.3f}-{wilson(1, 2)[1]:.3f})"
    )
    assert summarize(rows[:1], wall_s=1.0, inputs_run=1).lines()[1].startswith("this run: 1 input in 1.0 s")
