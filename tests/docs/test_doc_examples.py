"""Every example on every page runs: each python, bash, shell and console block of README.md and
docs/**/*.md is executed (Python in a subprocess with the repository on PYTHONPATH, `treesearch ...`
as `python -m treesearch ...`), and where the page shows its output, the output is compared. A block
that cannot run here carries `<!-- not-run: REASON -->`, and every reason is listed on
docs/development/testing.md. The same code on two pages (the own-problem example on README.md and
the guide) runs once and is compared with each page's output."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from doc_blocks import (
    ROOT,
    Block,
    console_steps,
    examples,
    listed_reasons,
    same_output,
    shell_commands,
)

ALL = examples()
RUN: dict[tuple[str, str], list[Block]] = {}
for _b in ALL:
    if _b.not_run is None:
        RUN.setdefault((_b.lang, _b.code), []).append(_b)


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "MPLBACKEND": "Agg", "TOKENIZERS_PARALLELISM": "false"}


def _treesearch(cmd: list[str], where: str, cwd) -> subprocess.CompletedProcess:
    assert cmd[0] == "treesearch", (
        f"{where}: `{' '.join(cmd)}` is not a treesearch command; run it here or mark the block "
        "<!-- not-run: REASON --> with a reason listed on docs/development/testing.md"
    )
    return subprocess.run(
        [sys.executable, "-m", "treesearch", *cmd[1:]],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )


def _params():
    for same in RUN.values():
        marks = [pytest.mark.real_model] + ([pytest.mark.slow] if any(b.slow for b in same) else [])
        yield pytest.param(same, id=same[0].where, marks=marks)


@pytest.mark.parametrize("same", list(_params()))
def test_the_example_runs_and_prints_what_its_page_shows(same: list[Block], tmp_path):
    block = same[0]
    if block.lang == "python":
        proc = subprocess.run(
            [sys.executable, "-c", block.code],
            cwd=tmp_path,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert proc.returncode == 0, f"{block.where}: {proc.stderr[-3000:]}"
        got = proc.stdout
    elif block.lang == "console":
        outs = []
        for cmd, shown in console_steps(block):
            proc = _treesearch(cmd, block.where, tmp_path)
            printed = proc.stdout if proc.returncode == 0 else proc.stdout + proc.stderr  # errors: stderr
            assert same_output(printed, shown), (
                f"{block.where}: `{' '.join(cmd)}` printed\n{printed}\nthe page shows\n{shown}"
            )
            outs.append(proc.stdout)
        got = "".join(outs)
    else:
        outs = []
        for cmd in shell_commands(block):
            proc = _treesearch(cmd, block.where, tmp_path)
            assert proc.returncode == 0, f"{block.where}: `{' '.join(cmd)}` failed: {proc.stderr[-3000:]}"
            outs.append(proc.stdout)
        got = "".join(outs)
    for b in same:
        if b.shown is not None:
            assert same_output(got, b.shown), f"{b.where} shows\n{b.shown}\nbut the block printed\n{got}"


def test_every_not_run_reason_is_listed_on_the_testing_page_and_every_listed_one_is_used():
    listed = listed_reasons()
    used = {b.not_run for b in ALL if b.not_run}
    unlisted = sorted(f"{b.where}: {b.not_run}" for b in ALL if b.not_run and b.not_run not in listed)
    assert not unlisted, "add these reasons to docs/development/testing.md, Examples not run:\n" + "\n".join(
        unlisted
    )
    assert sorted(set(listed) - used) == [], "listed on docs/development/testing.md but used by no block"
    assert len(listed) == len(set(listed))


def test_the_guides_own_problem_example_is_run_with_the_default_model_and_shows_its_real_output():
    """A new user writes their own Problem from the guide page alone: its example is executed (no
    marker), uses the default model, shows its output, and the README shows the same block."""
    guide = [b for b in ALL if b.path == "docs/guide/your-problem.md" and b.lang == "python"][0]
    assert guide.not_run is None and not guide.slow
    assert "class NextSentence(Problem)" in guide.code and "load_model()" in guide.code
    assert guide.shown is not None
    lines = guide.shown.strip().splitlines()
    nodes = int(lines[-1].split()[0])
    assert nodes > 2 and lines[-1] == f"{nodes} nodes, stop reason: None"
    assert "[+] #1 " in guide.shown and "[+] #2 " in guide.shown  # the root's children were expanded too
    assert lines[-2].startswith("Once upon a time") and " ," not in lines[-2]  # no space before a comma
    readme = [b for b in ALL if b.path == "README.md" and b.lang == "python"]
    assert [(b.code, b.shown) for b in readme] == [(guide.code, guide.shown)]


def test_the_readme_shows_the_demo_command_and_its_output():
    demo = [b for b in ALL if b.path == "README.md" and b.lang == "console"]
    assert len(demo) == 1 and demo[0].not_run is None
    (cmd, shown), *_ = console_steps(demo[0])
    make = (ROOT / "Makefile").read_text()
    assert '$(VENV)/bin/treesearch solve countdown "$(DEMO)" $(DEMO_FLAGS)' in make
    demo = re.search(r"^DEMO \?= (.+)$", make, re.M)
    flags = re.search(r"^DEMO_FLAGS \?= (.*)$", make, re.M)
    assert demo and flags
    # what `make demo` runs, its input and flags read from the Makefile (they cannot drift apart)
    assert cmd == ["treesearch", "solve", "countdown", demo[1].strip(), *flags[1].split()]
    assert "legend: " in shown and "solved: yes" in shown and "stats: " in shown
