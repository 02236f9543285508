"""`treesearch run`: a test set as JSON lines, resumable after a kill or Ctrl-C, bad rows and
failing searches recorded on their own lines."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from reliability_problems import Words
from run_rows import RUN, comparable, lines

from strategies import BFS
from treesearch import RKSCConfig, SaveFileError, Searcher
from treesearch.common.intervals import wilson
from treesearch.runs.results_file import ResultsFile, run_inputs, summarize


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(RUN + list(args), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("run") / "full.jsonl"
    done = run("--range", "900:906", "--concurrency", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    return lines(out)


def test_run_writes_one_line_per_input_in_order_and_a_summary(uninterrupted, tmp_path):
    assert [r["index"] for r in uninterrupted] == list(range(900, 906))
    from treesearch.tasks.game24 import load_puzzles

    assert [r["input"] for r in uninterrupted] == load_puzzles(900, 906)
    assert all(r["status"] == "complete" for r in uninterrupted)
    out = tmp_path / "again.jsonl"
    summary = tmp_path / "summary.json"
    done = run("--range", "900:906", "--concurrency", "3", "--out", str(out), "--json", str(summary))
    assert done.returncode == 0, done.stderr
    assert comparable(lines(out)) == comparable(uninterrupted)  # the concurrency changes nothing
    s = json.loads(summary.read_text())
    assert (
        s["inputs"] == 6 and s["inputs_run"] == 6 and s["solved"] == sum(r["solved"] for r in uninterrupted)
    )
    assert "accuracy" in done.stdout and "inputs/h" in done.stdout and "95% CI" in done.stdout


def test_each_row_records_its_cost_and_the_summary_prints_it(uninterrupted, tmp_path):
    """tokens = prefill + decode and wall_s = the search's own wall time, beside solved; the
    strategy's settings; the summary's tokens and seconds per problem are their means."""
    for r in uninterrupted:
        assert r["tokens"] == r["stats"]["prefill_tokens"] + r["stats"]["decode_tokens"] > 0
        assert r["wall_s"] == round(r["stats"]["wall_s"], 3) > 0
        assert r["strategy"] == {"name": "BFS", "breadth": 5, "max_depth": None}
    s = summarize(uninterrupted)
    assert s.tokens_per_problem == sum(r["tokens"] for r in uninterrupted) / 6
    assert s.seconds_per_problem == pytest.approx(sum(r["wall_s"] for r in uninterrupted) / 6)
    assert s.lines()[3] == (
        f"cost: {s.tokens_per_problem:.0f} tokens per problem (prefill + decode), "
        f"{s.seconds_per_problem:.2f} s per problem (each search's own wall time)"
    )


def test_resume_after_a_killed_run_gives_the_uninterrupted_file(uninterrupted, tmp_path):
    out = tmp_path / "killed.jsonl"
    proc = subprocess.Popen(
        RUN + ["--range", "900:906", "--concurrency", "2", "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)  # mid-run: some lines written, the rest not
    proc.wait()
    written = len(out.read_text().splitlines())
    assert 2 <= written < 6
    with open(out, "a") as f:
        f.write('{"index": 9')  # a half-written line, as a kill during a write would leave
    done = run("--range", "900:906", "--concurrency", "2", "--out", str(out), "--resume")
    assert done.returncode == 0, done.stderr
    assert f"{written} already in" in done.stderr
    rows = lines(out)
    assert sorted(r["index"] for r in rows) == list(range(900, 906))  # none missing, none twice
    assert comparable(sorted(rows, key=lambda r: r["index"])) == comparable(uninterrupted)


def test_ctrl_c_leaves_a_valid_file_that_resume_finishes(uninterrupted, tmp_path):
    out = tmp_path / "ctrl_c.jsonl"
    proc = subprocess.Popen(
        RUN + ["--range", "900:906", "--concurrency", "1", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 1):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "--resume" in err and "Traceback" not in err
    rows = lines(out)  # every line whole
    assert rows and len(rows) < 6
    done = run("--range", "900:906", "--concurrency", "1", "--out", str(out), "--resume")
    assert done.returncode == 0, done.stderr
    assert comparable(sorted(lines(out), key=lambda r: r["index"])) == comparable(uninterrupted)


def test_bad_rows_are_recorded_and_the_run_goes_on(tmp_path):
    inputs = tmp_path / "puzzles.txt"
    inputs.write_text("4 5 6 10\n1 2 3\na b c d\n")
    out = tmp_path / "out.jsonl"
    done = subprocess.run(
        RUN + ["--inputs", str(inputs), "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    rows = lines(out)
    assert [r["status"] for r in sorted(rows, key=lambda r: r["index"])] == ["complete", "invalid", "invalid"]
    bad = {r["index"]: r["error"] for r in rows if r["status"] == "invalid"}
    assert "four whole numbers" in bad[1] and "four whole numbers" in bad[2]
    assert "2 invalid" in done.stdout


def test_an_existing_file_is_not_overwritten_and_a_foreign_one_is_not_resumed(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text("not a result\n")
    done = run("--range", "900:901", "--out", str(out))
    assert done.returncode == 2 and "pass --resume" in done.stderr and "Traceback" not in done.stderr
    done = run("--range", "900:901", "--out", str(out), "--resume")
    assert done.returncode == 2 and "line 1 is not a result line" in done.stderr
    assert out.read_text() == "not a result\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--concurrency", "0"], "--concurrency 0: use at least 1 search at a time"),
        (["--range", "5:2"], "--range 5:2: use 0 <= A < B"),
        (["--range", "x:y"], "--range 'x:y': write A:B"),
        (["--inputs", "/nonexistent/file.txt"], "no such file"),
    ],
)
def test_run_argument_errors_are_one_line_before_the_model_loads(argv, message):
    done = run(*argv, "--out", "/nonexistent-dir/never.jsonl", timeout=120)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


class Fragile(Words):
    def parse_children(self, state, text):
        if state[0] == "b":
            raise ValueError("the parser cannot read b")
        return super().parse_children(state, text)


def test_a_search_that_raises_is_recorded_with_its_error_and_the_others_finish(tiny_lm, tmp_path):
    searcher = Searcher(
        tiny_lm, Fragile(width=2, depth=2, max_new_tokens=4), BFS(breadth=2), RKSCConfig(), progress=False
    )
    with ResultsFile(tmp_path / "out.jsonl") as out:
        summary = run_inputs(searcher, list(enumerate(["a", "b", "c"])), out, concurrency=3, progress=False)
    rows = lines(tmp_path / "out.jsonl")
    assert [r["status"] for r in rows] == ["complete", "failed", "complete"]
    assert "the parser cannot read b" in rows[1]["error"]
    assert summary.failed == 1 and summary.inputs == 3


def test_results_file_refuses_an_index_twice(tmp_path):
    with ResultsFile(tmp_path / "out.jsonl") as out:
        out.write({"index": 1, "solved": True})
        with pytest.raises(SaveFileError, match="already"):
            out.write({"index": 1, "solved": True})


def test_wilson_interval_and_summary_counts():
    assert wilson(0, 0) == (0.0, 0.0)
    low, high = wilson(5, 10)
    assert round(low, 3) == 0.237 and round(high, 3) == 0.763
    s = summarize(
        [
            {"solved": True, "status": "complete", "stats": {"decode_tokens": 3}},
            {"solved": False, "status": "failed", "stats": {"decode_tokens": 2}},
        ],
        wall_s=3600,
        inputs_run=2,
    )
    assert (s.inputs, s.solved, s.failed, s.inputs_per_hour, s.tokens["decode_tokens"]) == (2, 1, 1, 2.0, 5)
