"""The command line checks everything before the model loads and reports each mistake in one line,
`treesearch: error: ...`, exit status 2, naming the fix. "Before the model loads" is checked with
`treesearch.models.load.LOAD_HOOKS` (called by every load_model) and, in a fresh interpreter, by torch
never being imported; no timing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from treesearch.cli import main as cli
from treesearch.models import load as runtime
from treesearch.tasks import TASKS

MODEL_HELP = (
    "is not a folder or a known model; pass a Hugging Face model folder, a Hub id such as "
    "Qwen/Qwen2.5-0.5B-Instruct (downloaded once into the Hugging Face cache), 'tiny', a model that "
    "`treesearch models install` installs (qwen2.5-coder-0.5b, qwen2.5-coder-1.5b), or no model for the "
    "default SmolLM2-135M-Instruct"
)
OFFLINE_HELP = (
    "is not in the local Hugging Face cache and downloads are off (HF_HUB_OFFLINE=1 or --offline); run "
    "once without them to download it, or pass a model folder"
)
PUZZLE_FORM = 'a Game of 24 puzzle is four whole numbers such as "4 5 6 10"'

# (argv, the exact stderr line after "treesearch: error: ")
ERRORS = [
    (["solve", "game24", "4 5 6 10", "--breadth", "-2"], "--breadth -2: use at least 1 state per step"),
    (
        ["solve", "game24", "4 5 6 10", "--strategy", "mcts", "--iterations", "0"],
        "--iterations 0: use at least 1 iteration",
    ),
    (
        ["solve", "game24", "4 5 6 10", "--temperature", "-1"],
        "--temperature -1: use 0 for greedy or a positive value such as 0.7",
    ),
    (
        ["solve", "game24", "4 5 6 10", "--model", "/nonexistent/path"],
        f"--model /nonexistent/path {MODEL_HELP}",
    ),
    (
        ["solve", "game24", "4 5 6 10", "--model", "nobody/no-such-model", "--offline"],
        f"--model nobody/no-such-model {OFFLINE_HELP}",
    ),
    (["solve", "game24", "1 2 3"], f"bad game24 input: {PUZZLE_FORM}, got '1 2 3'"),
    (["solve", "game24", "a b c d"], f"bad game24 input: {PUZZLE_FORM}, got 'a b c d'"),
    (
        ["solve", "gsm8k", "  "],
        'bad gsm8k input: a GSM8K input is a word problem such as "Tom has 3 boxes of 4 '
        "apples and eats 2. How many are left?\", got '  '",
    ),
    (
        ["solve", "game24", "4 5 6 10", "--strategy", "greedy"],
        "unknown strategy 'greedy'; choose from beam, bfs, cot, dfs, mcts, sc",
    ),
    (["solve", "chess", "e4"], "unknown task 'chess'; choose from countdown, game24, gsm8k"),
    (
        ["solve", "game24", "4 5 6 10", "--strategy", "cot", "--breadth", "3"],
        "--breadth does not apply to --strategy cot; drop it, or use it with --strategy beam or bfs",
    ),
    (
        ["solve", "game24", "4 5 6 10", "--strategy", "cot", "--depth", "2"],
        "--depth does not apply to --strategy cot; drop it, or use it with --strategy beam, bfs, dfs or mcts",
    ),
    (
        ["solve", "game24", "4 5 6 10", "--iterations", "9"],
        "--iterations does not apply to --strategy bfs; drop it, or use it with --strategy mcts",
    ),
    (["solve", "game24", "4 5 6 10", "--top-p", "0"], "--top-p 0: use a value in (0, 1], such as 0.95"),
    (["solve", "game24", "4 5 6 10", "--threads", "0"], "--threads 0: use at least 1 thread"),
    (
        ["solve", "game24", "4 5 6 10", "--cache-budget", "0"],
        "--cache-budget 0: use a positive number of bytes, or leave it out for no limit",
    ),
    (["solve", "game24", "4 5 6 10", "--dtype", "int8"], "--dtype int8: use float32, bfloat16 or float16"),
    (
        ["solve", "game24", "4 5 6 10", "--resume", "no-such-file.json"],
        "--resume no-such-file.json does not exist; save a result first with SearchResult.save(path)",
    ),
    (
        ["solve", "game24", "4 5 6 10", "--kv", "bogus"],
        "argument --kv: invalid choice: 'bogus' (choose from 'off', 'exact', 'asks'); "
        "see treesearch solve --help",
    ),
    (
        ["solve", "game24", "4 5 6 10", "--breadth", "two"],
        "argument --breadth: invalid int value: 'two'; see treesearch solve --help",
    ),
    (["solve", "game24"], "the following arguments are required: input; see treesearch solve --help"),
    (["bench", "game24", "--model", "/nonexistent/path"], f"--model /nonexistent/path {MODEL_HELP}"),
    (["bench", "game24", "--threads", "0"], "--threads 0: use at least 1 thread"),
    (["bench", "game24", "--repeat", "0"], "--repeat 0: use at least 1 timed round"),
    (
        ["bench", "game24", "--modes", "fast"],
        "unknown mode 'fast'; choose from nokv, exact, asks, asks-open, cgee, rksc, server, hf-cb",
    ),
    (["bench", "game24", "--range", "5:1"], "--range '5:1'; need 0 <= START < END"),
    (
        ["bench", "tree", "--task", "mmlu_stem"],
        "--task mmlu_stem: the tree workload runs on gsm8k only; leave --task out",
    ),
    (
        ["bench", "chess"],
        "argument workload: invalid choice: 'chess' (choose from 'game24', 'branch', 'tree', "
        "'paraphrase'); see treesearch bench --help",
    ),
    (
        ["solve", "game24", "4 5 6 10", "--quantization", "int4"],
        "argument --quantization: invalid choice: 'int4' (choose from 'float32', 'int8', 'int8a8'); "
        "see treesearch solve --help",
    ),
    (
        ["solve", "game24", "4 5 6 10", "--quantization", "int8", "--device", "cuda"],
        "--quantization int8 runs on the CPU only, not on cuda; use float32 there",
    ),
    (
        ["run", "game24", "--quantization", "int8", "--dtype", "bfloat16"],
        "--quantization int8 computes in float32: drop --dtype bfloat16",
    ),
    (
        ["bench", "game24", "--quantization", "float32,int4"],
        "--quantization 'float32,int4': use one or more of float32, int8, int8a8, comma-separated",
    ),
]


@pytest.fixture
def loads() -> list:
    """The names load_model was called with during the test."""
    calls: list = []
    runtime.LOAD_HOOKS.append(calls.append)
    try:
        yield calls
    finally:
        runtime.LOAD_HOOKS.remove(calls.append)


@pytest.mark.parametrize("argv, message", ERRORS, ids=[" ".join(a) for a, _ in ERRORS])
def test_a_bad_argument_is_one_line_exit_2_before_the_model_loads(
    argv, message, loads, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # --offline sets it to 1: restored after the test
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"treesearch: error: {message}\n")
    assert loads == []


@pytest.mark.parametrize(
    "argv, message",
    [ERRORS[0], ERRORS[3], ERRORS[5], ERRORS[8], ERRORS[21]],
    ids=["breadth", "model", "puzzle", "strategy", "bench-model"],
)
def test_the_installed_command_prints_one_line_without_importing_torch(argv, message):
    code = (
        "import sys\nfrom treesearch.cli.main import main\nrc = main(sys.argv[1:])\n"
        "print(rc, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout, out.stderr) == (0, "2 False\n", f"treesearch: error: {message}\n")


def test_python_dash_m_exits_with_status_2():
    out = subprocess.run(
        [sys.executable, "-m", "treesearch.cli.main", "solve", "game24", "1 2 3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == f"treesearch: error: bad game24 input: {PUZZLE_FORM}, got '1 2 3'\n"


def test_a_good_command_loads_the_model_once_with_the_threads_asked(loads, capsys, monkeypatch):
    import torch

    threads: list[int] = []
    monkeypatch.setattr(
        runtime, "LOAD_HOOKS", runtime.LOAD_HOOKS + [lambda name: threads.append(torch.get_num_threads())]
    )
    before = torch.get_num_threads()
    assert (
        cli.main(
            [
                "solve",
                "game24",
                "4 5 6 10",
                "--model",
                "tiny",
                "--depth",
                "1",
                "--threads",
                "2",
                "--no-progress",
            ]
        )
        == 0
    )
    assert loads == ["tiny"] and threads == [2] and torch.get_num_threads() == before
    assert "tokens computed" in capsys.readouterr().out  # the short stats line


def test_solve_help_lists_every_registered_task(monkeypatch, capsys):
    monkeypatch.setitem(TASKS, "sudoku", TASKS["game24"])
    with pytest.raises(SystemExit) as info:
        cli.main(["solve", "--help"])
    assert info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "task name: countdown, game24, gsm8k, sudoku" in help_text
    assert "--threads N torch CPU threads for the run" in help_text
    assert (
        "--strategy STRATEGY one of beam, bfs, cot, dfs, mcts, sc (default bfs; cot: one chain-of-thought "
        "generation, no search; sc: self-consistency, the majority answer of --samples sampled chains of "
        "thought)" in help_text
    )


def test_greedy_gsm8k_on_the_command_line_warns_in_one_line(loads, capsys):
    question = "Tom has 3 apples and buys 4 more. How many apples does he have?"
    assert (
        cli.main(
            [
                "solve",
                "gsm8k",
                question,
                "--model",
                "tiny",
                "--temperature",
                "0",
                "--depth",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert err == (
        "treesearch: warning: GSM8K.samples_per_expand=3 with greedy sampling (temperature=0): the 3 "
        "generations of a node are identical and merge into one child; sample with a temperature > 0 "
        "(e.g. Sampling(temperature=0.7) or --temperature 0.7) or set samples_per_expand=1\n"
    )
