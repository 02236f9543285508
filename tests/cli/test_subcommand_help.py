"""A flag a command does not take is one line pointing at that command's own --help
(`treesearch run --help`, not `treesearch --help`), for every command; and the help of --model and
of TASK names what a user can pass (the installable models; which tasks have a search Problem)."""

from __future__ import annotations

import pytest

from treesearch.cli import main as cli
from treesearch.models.install import KNOWN

BAD_FLAG = [
    (["run", "game24", "--bogus"], "unrecognized arguments: --bogus; see treesearch run --help"),
    (
        ["run", "game24", "--breadth", "2", "--bogus", "3"],
        "unrecognized arguments: --bogus 3; see treesearch run --help",
    ),
    (
        ["solve", "game24", "4 5 6 10", "--bogus"],
        "unrecognized arguments: --bogus; see treesearch solve --help",
    ),
    (["bench", "game24", "--bogus"], "unrecognized arguments: --bogus; see treesearch bench --help"),
    (["bench", "threads", "--bogus"], "unrecognized arguments: --bogus; see treesearch bench threads --help"),
    (["calibrate", "--bogus"], "unrecognized arguments: --bogus; see treesearch calibrate --help"),
    (["models", "list", "--bogus"], "unrecognized arguments: --bogus; see treesearch models list --help"),
]


@pytest.mark.parametrize("argv, message", BAD_FLAG, ids=[" ".join(a[:2]) for a, _ in BAD_FLAG])
def test_a_bad_flag_points_at_the_subcommands_own_help(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    assert capsys.readouterr() == ("", f"treesearch: error: {message}\n")


def help_text(command: str, capsys) -> str:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", ["run", "solve"])
def test_model_help_names_the_installable_models(command, capsys):
    assert list(KNOWN) == ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    assert (
        "--model MODEL HF model folder, a Hub id such as Qwen/Qwen2.5-0.5B-Instruct (downloaded once into "
        "the Hugging Face cache), a model that `treesearch models install` installs (qwen2.5-coder-0.5b, "
        "qwen2.5-coder-1.5b), or 'tiny' for a random test model (default: embedded SmolLM2-135M-Instruct)"
    ) in help_text(command, capsys)


@pytest.mark.parametrize("command", ["run", "solve"])
def test_task_help_says_which_tasks_have_a_search_problem(command, capsys):
    assert (
        "task task name: countdown, game24, gsm8k (arc_challenge and mmlu_stem: no search Problem, for "
        "bench and "
        "calibrate only); or your own treesearch.Problem subclass as MODULE:CLASS"
    ) in help_text(command, capsys)
