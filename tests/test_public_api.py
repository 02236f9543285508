"""The public face after the move into packages: every name `treesearch` and `strategies` export
still imports, and every command's --help works (and loads no torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import strategies
import treesearch

COMMANDS = [
    [],
    ["solve"],
    ["run"],
    ["bench"],
    ["calibrate"],
    ["bench", "claims"],
    ["bench", "calibrate-asks"],
]


@pytest.mark.parametrize("name", treesearch.__all__)
def test_every_exported_name_imports(name):
    assert getattr(treesearch, name) is not None
    exec(f"from treesearch import {name}", {})


@pytest.mark.parametrize("name", strategies.__all__)
def test_every_strategies_name_imports(name):
    assert getattr(strategies, name) is not None


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "treesearch")
def test_each_commands_help_exits_0_and_names_its_usage(command):
    out = subprocess.run(
        [sys.executable, "-m", "treesearch", *command, "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: treesearch")


def test_help_loads_no_torch():
    code = (
        "import sys\nfrom treesearch.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "False"
