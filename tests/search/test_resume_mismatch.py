"""A resume continues only the search it was saved from: another input, task, model or any setting
that changes what the search finds is refused in one line naming both values (`ResumeError` in
Python; on the command line `treesearch: error: ...`, exit 2, before the model loads). Settings
that change only when K/V is computed (budget, eviction, exact or no sharing) may differ.

The saved search is a real one: the default model's Game of 24 search of "1 2 4 7", interrupted
by Ctrl-C (a KeyboardInterrupt) at its first valuation and saved as `treesearch solve` saves it."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

import strategies
from treesearch import ResumeError, RKSCConfig, Sampling, Searcher
from treesearch.cli import main as cli
from treesearch.cli.checks import check_solve
from treesearch.models import load as runtime
from treesearch.tasks import GSM8K, Game24


class StopAtFirstValue(Game24):
    """Game24 that raises KeyboardInterrupt (what Ctrl-C raises) at its first value prompt."""

    def value_prompt(self, state):
        raise KeyboardInterrupt


@pytest.fixture(scope="module")
def saved(real_lm, tmp_path_factory):
    """The folder holding partial.json: the interrupted real search of "1 2 4 7", BFS breadth 1."""
    searcher = Searcher(real_lm, StopAtFirstValue(), strategies.BFS(breadth=1), progress=False)
    with pytest.raises(KeyboardInterrupt) as info:
        searcher.solve("1 2 4 7")
    part = info.value.partial_result
    assert part.status == "interrupted" and len(part.tree) > 1  # the root and the moves it proposed
    folder = tmp_path_factory.mktemp("resume")
    part.save(folder / "partial.json", Game24())
    return folder


@pytest.fixture
def loads() -> list:
    """The names load_model was called with during the test."""
    calls: list = []
    runtime.LOAD_HOOKS.append(calls.append)
    try:
        yield calls
    finally:
        runtime.LOAD_HOOKS.remove(calls.append)


def fix(key: str, saved: str, mine: str) -> str:
    return (
        f"the saved search has {key}={saved} but this Searcher has {mine}; build the Searcher with the saved "
        f"search's {key} to continue it"
    )


@pytest.mark.real_model
def test_resume_refuses_a_different_input(real_lm, saved):
    searcher = Searcher(real_lm, Game24(), strategies.BFS(breadth=1), progress=False)
    with pytest.raises(ResumeError) as info:
        searcher.resume(saved / "partial.json", "4 5 6 10")
    assert str(info.value) == (
        "the saved search has input='1 2 4 7' but this resume was given '4 5 6 10'; resume without an "
        "input to continue the saved one, or solve('4 5 6 10') for a new search"
    )


@pytest.mark.real_model
def test_resume_refuses_another_model(tiny_lm, saved):
    searcher = Searcher(tiny_lm, Game24(), strategies.BFS(breadth=1), progress=False)
    with pytest.raises(ResumeError) as info:
        searcher.resume(saved / "partial.json")
    assert str(info.value) == fix("model", "'SmolLM2-135M-Instruct'", "'tiny-random-llama'")


def deeper() -> Game24:
    g = Game24()
    g.max_depth = 3
    return g


GAME24_STOP = ("\nNumbers:", "\n\n", "Input:")
# (Searcher keyword arguments beside the model, the exact ResumeError message)
REFUSED = [
    ({"problem": GSM8K()}, fix("problem", "'game24'", "'gsm8k'")),
    ({"problem": deeper()}, fix("max_depth", "4", "3")),
    ({"seed": 1}, fix("seed", "0", "1")),
    ({"strategy": strategies.MCTS()}, fix("strategy", "'BFS'", "'MCTS'")),
    ({"strategy": strategies.BFS(breadth=2)}, fix("strategy_config.breadth", "1", "2")),
    (
        {"sampling": Sampling(max_new_tokens=96, temperature=0.7, stop=GAME24_STOP)},
        fix("sampling.temperature", "0.0", "0.7"),
    ),
    ({"config": RKSCConfig(kv_sharing="asks")}, fix("kv_sharing", "'exact'", "'asks'")),
    ({"config": RKSCConfig(cgee=True)}, fix("cgee", "'off'", "'on'")),
]


@pytest.mark.real_model
@pytest.mark.parametrize("change, message", REFUSED, ids=[m.split(" but")[0][21:] for _, m in REFUSED])
def test_resume_refuses_each_setting_that_changes_the_search(real_lm, saved, change, message):
    kw = {"problem": Game24(), "strategy": strategies.BFS(breadth=1), **change}
    searcher = Searcher(real_lm, kw.pop("problem"), kw.pop("strategy"), kw.pop("config", None), **kw)
    with pytest.raises(ResumeError) as info:
        searcher.resume(saved / "partial.json")
    assert str(info.value) == message


CLI_FIX = "to continue it, or drop --resume for a new search"
SOLVE = ["solve", "game24", "4 5 6 10", "--breadth", "1", "--resume", "partial.json"]
SAME = ["solve", "game24", "1 2 4 7", "--breadth", "1", "--resume", "partial.json"]
# (argv, the exact stderr line after "treesearch: error: --resume partial.json: the saved search has ")
CLI_REFUSED = [
    (SOLVE, f"input '1 2 4 7' but this command has '4 5 6 10'; give the saved INPUT {CLI_FIX}"),
    (
        ["solve", "gsm8k", "Tom has 3 apples. How many?", "--breadth", "1", "--resume", "partial.json"],
        f"problem 'game24' but this command has 'gsm8k'; give the saved TASK {CLI_FIX}",
    ),
    (SAME + ["--seed", "1"], f"seed 0 but this command has 1; give the saved --seed {CLI_FIX}"),
    (
        ["solve", "game24", "1 2 4 7", "--strategy", "mcts", "--resume", "partial.json"],
        f"strategy 'BFS' but this command has 'MCTS'; give the saved --strategy {CLI_FIX}",
    ),
    (
        ["solve", "game24", "1 2 4 7", "--resume", "partial.json"],
        "strategy_config.breadth 1 but this command has 5; give the saved strategy flags (--breadth, "
        f"--depth, --iterations, ...) {CLI_FIX}",
    ),
    (
        SAME + ["--temperature", "0.7"],
        "sampling.temperature 0.0 but this command has 0.7; give the saved --temperature and --top-p "
        + CLI_FIX,
    ),
    (
        SAME + ["--kv", "asks"],
        f"kv_sharing 'exact' but this command has 'asks'; give the saved --kv {CLI_FIX}",
    ),
    (SAME + ["--cgee", "on"], f"cgee 'off' but this command has 'on'; give the saved --cgee {CLI_FIX}"),
    (
        SAME + ["--model", "tiny"],
        "model 'SmolLM2-135M-Instruct' but this command has 'tiny-random-llama'; give the saved --model "
        + CLI_FIX,
    ),
    (
        SAME + ["--dtype", "bfloat16"],
        f"dtype 'float32' but this command has 'bfloat16'; give the saved --dtype {CLI_FIX}",
    ),
]


@pytest.mark.real_model
@pytest.mark.parametrize("argv, message", CLI_REFUSED, ids=[m.split(" but")[0] for _, m in CLI_REFUSED])
def test_solve_resume_refuses_a_mismatch_in_one_line_before_the_model_loads(
    saved, argv, message, loads, capsys, monkeypatch
):
    monkeypatch.chdir(saved)
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"treesearch: error: --resume partial.json: the saved search has {message}\n")
    assert loads == []


@pytest.mark.real_model
def test_the_installed_command_refuses_another_input_without_a_traceback_or_torch(saved):
    code = (
        "import sys\nfrom treesearch.cli.main import main\nrc = main(sys.argv[1:])\n"
        "print(rc, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *SOLVE], capture_output=True, text=True, timeout=120, cwd=saved
    )
    assert (out.returncode, out.stdout) == (0, "2 False\n")
    assert (
        out.stderr == f"treesearch: error: --resume partial.json: the saved search has {CLI_REFUSED[0][1]}\n"
    )


@pytest.mark.real_model
@pytest.mark.parametrize(
    "extra",
    [[], ["--kv", "off"], ["--cache-budget", "50000000", "--eviction", "lru", "--step-tokens", "64"]],
    ids=["same", "kv-off", "budget"],
)
def test_solve_resume_accepts_the_same_search_under_settings_that_change_no_result(saved, extra, monkeypatch):
    """The same puzzle written another way ("1, 2, 4, 7" parses to the same root state), exact or no
    sharing, any budget, eviction order or prefill step: the checks pass (the model would load next)."""
    from treesearch.cli.main import build_parser

    monkeypatch.chdir(saved)
    for puzzle in ("1 2 4 7", "1, 2, 4, 7"):
        args: argparse.Namespace = build_parser().parse_args(
            ["solve", "game24", puzzle, "--breadth", "1", "--resume", "partial.json", *extra]
        )
        plan = check_solve(args)
        assert plan.problem.name == "game24"
