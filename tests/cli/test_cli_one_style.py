"""Every command reports a bad argument the same way: one line, `treesearch: error: ...`, exit status 2,
whichever module found it (the calibrate and backend checks too), and every command takes the same task
names. Each case runs the real command in a fresh interpreter, before any model loads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SERVER_URL = "--base-url http://127.0.0.1:9/v1"
# (argv, the exact stderr line after "treesearch: error: ")
ERRORS = [
    (
        ["solve", "game24", "4 5 6 10", "--backend", "server"],
        "the server backend needs --base-url, e.g. --base-url http://127.0.0.1:8000/v1",
    ),
    (
        ["solve", "game24", "4 5 6 10", "--backend", "server", *SERVER_URL.split(), "--server-extra", "[1]"],
        "--server-extra must be a JSON object, e.g. '{\"top_k\": 0}'",
    ),
    (
        ["run", "game24", "--range", "900:901", "--backend", "server"],
        "the server backend needs --base-url, e.g. --base-url http://127.0.0.1:8000/v1",
    ),
    (
        ["calibrate", "--task", "game24", "--range", "850:950"],
        "--range 850:950 overlaps the Game of 24 benchmark rows 900:1000; pick others",
    ),
    (
        ["calibrate", "--range", "5"],
        "argument --range: range '5'; use START:END with START < END, e.g. 800:810; "
        "see treesearch calibrate --help",
    ),
    (
        ["calibrate", "--task", "chess"],
        "argument --task: invalid choice: 'chess' (choose from 'game24', 'arc_challenge', 'mmlu_stem'); "
        "see treesearch calibrate --help",
    ),
    # the long task names in calibrate, the short ones in bench: the same tasks (this check comes after the
    # task was accepted)
    (
        ["calibrate", "--task", "arc_challenge", "--range", "0:5", "--eval-range", "0:3"],
        "--eval-range 0:3 overlaps --range 0:5; held-out rows must be other rows",
    ),
    (
        ["calibrate", "--task", "mmlu_stem", "--range", "0:5", "--eval-range", "4:6"],
        "--eval-range 4:6 overlaps --range 0:5; held-out rows must be other rows",
    ),
    (
        ["bench", "tree", "--task", "arc"],
        "--task arc_challenge: the tree workload runs on gsm8k only; leave --task out",
    ),
    (
        ["solve", "arc", "Which gas do plants take in?"],
        "task arc_challenge has no search Problem; solve and run take countdown, game24, gsm8k",
    ),
    (
        ["run", "mmlu_stem"],
        "task mmlu_stem has no search Problem; solve and run take countdown, game24, gsm8k",
    ),
]


def treesearch(*argv: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "treesearch", *argv], capture_output=True, text=True, timeout=300, cwd=cwd
    )


@pytest.mark.parametrize("argv, message", ERRORS, ids=[" ".join(a) for a, _ in ERRORS])
def test_every_command_reports_a_bad_argument_in_one_line_with_exit_2(argv, message, tmp_path):
    out = treesearch(*argv, cwd=tmp_path)
    assert (out.returncode, out.stdout, out.stderr) == (2, "", f"treesearch: error: {message}\n")


def test_no_library_module_raises_system_exit():
    """Library code raises UsageError; only the entry point turns it into an exit status."""
    root = Path(__file__).resolve().parents[2] / "treesearch"
    found = [
        f"{p.relative_to(root)}:{n}"
        for p in sorted(root.rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "SystemExit" in line and p.name != "__main__.py"
    ]
    assert found == []


def test_argparse_stops_at_the_command_line_package():
    """The flags are parsed and turned into plain values in treesearch/cli/; strategies, the engine, bench
    and calibrate never see an argparse.Namespace (the --strategy names live in cli/strategy_flags.py)."""
    import strategies

    root = Path(__file__).resolve().parents[2]
    users = sorted(
        str(p.relative_to(root))
        for p in [*(root / "treesearch").rglob("*.py"), *(root / "strategies").glob("*.py")]
        if "argparse" in p.read_text() and "cli" not in p.relative_to(root).parts
    )
    assert users == [] and not hasattr(strategies, "FROM_CLI")
