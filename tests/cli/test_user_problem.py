"""A user's own Problem class on the command line: `treesearch solve MODULE:CLASS "input"` and
`treesearch run MODULE:CLASS --inputs FILE` run it as they run a built-in task (built with no
arguments, inputs checked before the model loads, the same flags), from a module in the current
directory; a path that names no Problem subclass is one line naming what it found, exit 2, before a
model loads."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from treesearch.cli import main as cli
from treesearch.models import load as runtime

ROOT = Path(__file__).resolve().parents[2]

# A chain-style problem a user writes: each step adds a generated word; four words end it.
USER_MODULE = textwrap.dedent(
    '''
    from treesearch import Child, ParseError, Problem, Sampling


    class Sentence(Problem):
        """Grow a sentence word by word; its value is how many distinct words it has."""

        name = "sentence"
        max_depth = 2
        sampling = Sampling(max_new_tokens=6, stop=("\\n",))

        def check_input(self, x):
            if not str(x).strip():
                raise ParseError(f"a Sentence input is the start of a sentence such as 'The sea', got {x!r}")

        def expand_prompt(self, state):
            return "Continue the sentence: " + state

        def parse_children(self, state, text):
            return [Child(w, state + " " + w) for w in text.split()[:2]]

        def value(self, state):
            return float(len(set(state.split())))

        def is_terminal(self, state):
            return len(state.split()) >= 4

        def is_solved(self, state):
            return len(state.split()) >= 4

        def answer(self, state):
            return state


    def helper():
        return 1


    class NotAProblem:
        pass


    class NeedsArgs(Sentence):
        def __init__(self, size):
            self.size = size


    class NoParse(Problem):
        def expand_prompt(self, state):
            return state


    instance = Sentence()
    NUMBER = 3
    '''
)


def cli_run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`python -m treesearch ARGS` in `cwd`, this checkout's package first on the path."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "TOKENIZERS_PARALLELISM": "false"}
    import os

    env.update({k: v for k, v in os.environ.items() if k in ("HOME", "TREESEARCH_CACHE", "XDG_CACHE_HOME")})
    return subprocess.run(
        [sys.executable, "-m", "treesearch", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cwd,
        env=env,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project folder holding my_problems.py."""
    (tmp_path / "my_problems.py").write_text(USER_MODULE)
    return tmp_path


@pytest.mark.real_model
def test_solve_runs_a_users_class_from_the_current_directory_on_the_default_model(project):
    out = project / "result.json"
    done = cli_run(
        ["solve", "my_problems:Sentence", "The sea", "--breadth", "2", "--threads", "2", "--no-progress"]
        + ["--json", str(out)],
        project,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    tree = result["tree"]
    assert tree["graph"]["problem"] == "sentence" and tree["graph"]["input"] == "The sea"
    assert len(tree["nodes"]) > 1
    assert max(n["depth"] for n in tree["nodes"]) == 2  # the class's own max_depth
    states = [n["state"] for n in tree["nodes"]]
    assert states[0] == "The sea" and all(s.startswith("The sea ") for s in states[1:])
    lines = done.stdout.splitlines()
    assert any(ln.startswith("answer: The sea ") for ln in lines) or "solved: no" in lines
    assert f"wrote {out}" in lines


@pytest.mark.real_model
def test_run_searches_each_line_of_an_inputs_file_with_a_users_class(project):
    (project / "inputs.txt").write_text("The sea\nA cat\n")
    done = cli_run(
        ["run", "my_problems:Sentence", "--inputs", "inputs.txt", "--depth", "1", "--concurrency", "2"]
        + ["--threads", "2", "--no-progress"],
        project,
    )
    assert done.returncode == 0, done.stderr
    out = project / "my_problems.Sentence-0-2.jsonl"  # the default name, from MODULE.CLASS
    assert f"wrote {out.name}" in done.stdout.splitlines()
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert sorted((r["index"], r["input"], r["status"]) for r in rows) == [
        (0, "The sea", "complete"),
        (1, "A cat", "complete"),
    ]
    assert all(r["answer"] is None or r["answer"].startswith(r["input"] + " ") for r in rows)


HERE = "{here}"  # replaced by the test's folder
BAD_PATHS = [
    (
        ["solve", "no_such_module:Sentence", "x"],
        f"no_such_module:Sentence: no module named 'no_such_module' in the current directory ({HERE}) or on "
        "the Python path",
    ),
    (
        ["solve", "my_problems:Sentense", "x"],
        f"my_problems:Sentense: {HERE}/my_problems.py has no attribute 'Sentense'; it defines NeedsArgs, "
        "NoParse, Sentence",
    ),
    (
        ["solve", "my_problems:helper", "x"],
        "my_problems:helper names a function, not a treesearch.Problem subclass",
    ),
    (
        ["solve", "my_problems:NotAProblem", "x"],
        "my_problems:NotAProblem names the class NotAProblem, not a treesearch.Problem subclass",
    ),
    (
        ["solve", "my_problems:instance", "x"],
        "my_problems:instance names a Sentence instance (name its class: the command builds it), not a "
        "treesearch.Problem subclass",
    ),
    (
        ["solve", "my_problems:NUMBER", "x"],
        "my_problems:NUMBER names an int, not a treesearch.Problem subclass",
    ),
    (
        ["solve", "my_problems:Problem", "x"],
        "my_problems:Problem names treesearch.Problem itself, not a treesearch.Problem subclass",
    ),
    (
        ["solve", "my_problems:NeedsArgs", "x"],
        "my_problems:NeedsArgs: NeedsArgs() failed (TypeError: NeedsArgs.__init__() missing 1 required "
        "positional argument: 'size'); the command builds the class with no arguments, so give every "
        "__init__ parameter a default",
    ),
    (
        ["solve", "my_problems:NoParse", "x"],
        "my_problems:NoParse: NoParse must define parse_children(); see treesearch.Problem's docstring",
    ),
    (
        ["solve", "broken:Sentence", "x"],
        "broken:Sentence: importing broken failed: SyntaxError: invalid syntax (broken.py, line 1)",
    ),
    (
        ["solve", "raises:Sentence", "x"],
        "raises:Sentence: importing raises failed: RuntimeError: the module's own error",
    ),
    (
        ["solve", "my_problems:", "x"],
        "my_problems:: write MODULE:CLASS, e.g. my_module:MyProblem for class MyProblem in my_module.py",
    ),
    (
        ["solve", "my_problems:Sentence", "  "],
        "bad my_problems:Sentence input: a Sentence input is the start of a sentence such as 'The sea', "
        "got '  '",
    ),
    (
        ["run", "my_problems:Sentence"],
        "my_problems:Sentence has no test set of its own; give its inputs with --inputs FILE (one a line)",
    ),
]


@pytest.fixture
def loads() -> list:
    calls: list = []
    runtime.LOAD_HOOKS.append(calls.append)
    try:
        yield calls
    finally:
        runtime.LOAD_HOOKS.remove(calls.append)


@pytest.mark.parametrize("argv, message", BAD_PATHS, ids=[a[1] + " " + a[0] for a, _ in BAD_PATHS])
def test_a_bad_class_path_is_one_line_exit_2_before_the_model_loads(
    argv, message, project, loads, capsys, monkeypatch
):
    (project / "broken.py").write_text("def (:\n")
    (project / "raises.py").write_text("raise RuntimeError('the module\\'s own error')\n")
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("my_problems", "broken", "raises"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"treesearch: error: {message.replace(HERE, str(project))}\n")
    assert loads == []
