"""The accuracy page's generated tables: a run's cost per problem, and paired comparisons."""

from __future__ import annotations

import json

from treesearch.bench.pages import _run_label, accuracy, comparisons, page

RUN = {
    "task": "gsm8k",
    "model": "qwen2.5-coder-0.5b",
    "quantization": "int8",
    "strategy": "bfs",
    "solved": 3,
    "searched": 4,
    "inputs_run": 4,
    "accuracy": 0.75,
    "accuracy_low": 0.3,
    "accuracy_high": 0.954,
    "tokens": {"prefill_tokens": 1000, "decode_tokens": 600},
    "wall_s": 10.0,
    "inputs_per_hour": 1440.0,
}
PAIR = {
    "a": "runs/gsm8k-bfs.jsonl",
    "b": "runs/gsm8k-cot.jsonl",
    "command": "treesearch compare runs/gsm8k-bfs.jsonl runs/gsm8k-cot.jsonl --json x.json",
    "rows": 10,
    "both": 2,
    "only_a": 4,
    "only_b": 1,
    "neither": 3,
    "accuracy_a": 0.6,
    "accuracy_b": 0.3,
    "difference": 0.3,
    "difference_low": -0.0534,
    "difference_high": 0.5826,
    "p_value": 0.375,
    "tokens_a": 1234.5,
    "tokens_b": 400.0,
    "seconds_a": 3.0,
    "seconds_b": 1.0,
}


def test_accuracy_rows_give_precision_and_cost_per_problem():
    older = {**RUN, "quantization": None, "command": "treesearch run gsm8k --quantization int8"}
    lines = accuracy([("a.json", RUN), ("b.json", {**RUN, "quantization": None}), ("c.json", older)])
    row = "| gsm8k |  | qwen2.5-coder-0.5b | int8 | bfs | 3 of 4 | 0.75 (0.30-0.95) | 400 | 2.5 |"
    assert lines[2] == row
    assert [ln.split(" | ")[3] for ln in lines[3:]] == ["float32", "int8"]  # the default; the command


def test_a_resumed_runs_tokens_are_per_searched_row_and_its_wall_per_row_run():
    """A resumed run's token totals cover every row in its file; its wall time only this process's."""
    resumed = {**RUN, "command": "treesearch run gsm8k --range 0:4 --resume", "inputs_run": 1}
    line = accuracy([("a.json", resumed)])[2]
    assert (
        line == "| gsm8k | 0:4 | qwen2.5-coder-0.5b | int8 | bfs | 3 of 4 | 0.75 (0.30-0.95) | 400 | 10.0 |"
    )
    recorded = {**resumed, "tokens_per_problem": 512.4}
    assert accuracy([("a.json", recorded)])[2].split(" | ")[7] == "512"


def test_comparison_rows_name_the_runs_by_file():
    assert comparisons([("compare-x.json", PAIR)])[2] == (
        "| gsm8k-bfs | gsm8k-cot | 10 | 2 | 4 | 1 | 3 | +0.300 (-0.053 to +0.583) | 0.375 | 1,234, 400 |"
    )


def test_accuracy_page_shows_paired_comparisons_when_there_are_some(tmp_path):
    (tmp_path / "accuracy-a.json").write_text(json.dumps(RUN))
    lines, _ = page("accuracy", tmp_path, tmp_path)
    assert "### Paired" not in lines
    (tmp_path / "compare-a.json").write_text(json.dumps(PAIR))
    lines, _ = page("accuracy", tmp_path, tmp_path)
    at = lines.index("### Paired")
    assert lines[at + 4].startswith("| gsm8k-bfs | gsm8k-cot | 10 |")
    assert lines[-1] == f"- `{PAIR['command']}` (`data/compare-a.json`)"


def test_a_runs_plot_label_names_its_rows_and_precision():
    """Two runs of one task and strategy (other rows, another precision) get different labels;
    an older report without the quantization field has it read from its command."""
    run = {**RUN, "command": "treesearch run gsm8k --range 0:200 --model m"}
    assert _run_label(run) == "gsm8k bfs 0:200 (qwen2.5-coder-0.5b, int8)"
    old = {k: v for k, v in RUN.items() if k != "quantization"}
    old["command"] = "treesearch run gsm8k --range 0:100 --quantization float32"
    assert _run_label(old) == "gsm8k bfs 0:100 (qwen2.5-coder-0.5b, float32)"
    assert _run_label({"task": "t", "strategy": "cot", "model": "m"}) == "t cot (m)"
