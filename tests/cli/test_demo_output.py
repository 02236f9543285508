"""What `treesearch solve` prints after the tree, run as a user runs it (a subprocess, tiny model):
the line saying what the tree holds, one short stats line by default, every counter with --stats
(the JSON has them always); torch's OpenMP threads spin only briefly (GOMP_SPINCOUNT in the
environment before torch loads, via the CLI and via load_model) unless the user set it or
OMP_WAIT_POLICY; and `make demo`'s search, run with its model and flags as the Makefile runs it,
ends with a verified answer on a tree of at least two expanded branches and a pruned node."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from treesearch.common.stats import Stats

ROOT = Path(__file__).resolve().parents[2]
# records OMP_WAIT_POLICY and GOMP_SPINCOUNT at the moment torch is first imported, then runs the code
SPY = """
import importlib.abc, json, os, sys
seen = []
class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.append([os.environ.get(v, "<unset>") for v in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")])
        return None
sys.meta_path.insert(0, Spy())
try:
    {code}
finally:
    print("policy when torch loaded:", json.dumps(seen), file=sys.stderr)
"""
SOLVE = [
    "solve",
    "game24",
    "4 5 6 10",
    "--model",
    "tiny",
    "--no-progress",
    "--threads",
    "1",
    "--breadth",
    "1",
]
STATS = re.compile(
    r"stats: (\d+) tokens computed, (\d+) reused from the K/V cache; (\d+) model calls; (\d+\.\d) s; "
    r"peak K/V (\d+(?:\.\d+)?) (B|KiB|MiB|GiB) \(--stats for all counters\)"
)


def spy(code: str, env_policy: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    return subprocess.run(
        [sys.executable, "-c", SPY.format(code=code)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )


def policy_seen(proc: subprocess.CompletedProcess) -> list[list[str]]:
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("policy when torch loaded:")][-1]
    return json.loads(line.partition(":")[2])


def solve(
    tmp_path: Path, *extra: str, env_policy: str | None = None
) -> tuple[list[str], dict, list[list[str]]]:
    argv = [*SOLVE, "--json", str(tmp_path / "r.json"), *extra]
    proc = spy(f"from treesearch.cli.main import main; rc = main({argv!r}); assert rc == 0, rc", env_policy)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines(), json.loads((tmp_path / "r.json").read_text()), policy_seen(proc)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    return solve(tmp_path_factory.mktemp("default"))


def test_the_tree_line_counts_what_the_tree_holds(default_run):
    out, saved, _ = default_run
    nodes = saved["tree"]["nodes"]
    status = [d["status"] for d in nodes]
    root_kids = [e["target"] for e in saved["tree"]["links"] if e["source"] == 0]
    branches = sum(status[k] == "expanded" for k in root_kids)
    (line,) = [ln for ln in out if ln.startswith("tree: ")]
    solutions = status.count("solution")
    assert line == (
        f"tree: {len(nodes)} nodes; {status.count('expanded')} expanded ({branches} of the root's "
        f"{len(root_kids)} children), {status.count('pruned')} pruned, {solutions} "
        f"solution{'' if solutions == 1 else 's'}, {status.count('frontier')} left unexpanded"
    )


def demo_command() -> tuple[str, list[str]]:
    """The Countdown input and flags of `make demo`, read from the Makefile."""
    text = (ROOT / "Makefile").read_text()
    demo = re.search(r"^DEMO \?= (.+)$", text, re.M)
    flags = re.search(r"^DEMO_FLAGS \?= (.*)$", text, re.M)
    assert demo and flags and '$(VENV)/bin/treesearch solve countdown "$(DEMO)" $(DEMO_FLAGS)' in text
    return demo[1].strip(), flags[1].split()


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> tuple[list[str], str, dict]:
    """`make demo`'s search, run as the Makefile runs it: (stdout lines, its input, the saved result)."""
    demo, flags = demo_command()
    path = tmp_path_factory.mktemp("demo") / "demo.json"
    done = subprocess.run(
        [sys.executable, "-m", "treesearch.cli.main", "solve", "countdown", demo, *flags]
        + ["--no-progress", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines(), demo, json.loads(path.read_text())


TREE_LINE = re.compile(
    r"tree: (\d+) nodes; (\d+) expanded \((\d+) of the root's (\d+) children\), (\d+) pruned, "
    r"(\d+) solutions?, (\d+) left unexpanded"
)


@pytest.mark.real_model
@pytest.mark.slow
def test_make_demo_ends_with_a_verified_answer(demo_run):
    from treesearch.tasks.countdown import answer_rejection, parse_input

    out, demo, saved = demo_run
    assert "solved: yes" in out and saved["solved"] is True
    (answer,) = [ln for ln in out if ln.startswith("answer: ")]
    target, numbers = parse_input(demo)
    expression = answer.removeprefix("answer: ").split(" (node")[0]
    assert answer_rejection(expression, numbers, target) is None  # verified again, here
    (line,) = [ln for ln in out if ln.startswith("tree: ")]
    assert TREE_LINE.fullmatch(line) is not None, line


@pytest.mark.real_model
@pytest.mark.slow
def test_make_demo_tree_has_two_expanded_branches_and_a_pruned_node(demo_run):
    out, _, saved = demo_run
    (line,) = [ln for ln in out if ln.startswith("tree: ")]
    m = TREE_LINE.fullmatch(line)
    assert m is not None and int(m[3]) >= 2 and int(m[5]) >= 1
    assert [d["status"] for d in saved["tree"]["nodes"]].count("pruned") == int(m[5])


def test_the_default_stats_line_is_one_short_line_of_the_runs_own_counters(default_run):
    out, saved, _ = default_run
    lines = [ln for ln in out if ln.startswith("stats:")]
    assert len(lines) == 1 and not any(ln.startswith("all stats:") for ln in out)
    m = STATS.fullmatch(lines[0])
    assert m is not None, lines[0]
    st = saved["stats"]
    assert int(m[1]) == st["prefill_tokens"] + st["decode_tokens"] and int(m[2]) == st["reused_tokens"]
    assert int(m[3]) == st["model_calls"] and m[4] == f"{st['wall_s']:.1f}"
    assert set(st) == set(Stats().as_dict())  # the JSON keeps every counter


def test_stats_flag_prints_every_counter_as_the_json_has_it(tmp_path):
    out, saved, _ = solve(tmp_path, "--stats")
    (line,) = [ln for ln in out if ln.startswith("all stats: ")]
    shown = dict(kv.split("=") for kv in line.removeprefix("all stats: ").split(", "))
    assert list(shown) == list(saved["stats"])
    assert shown == {k: f"{v:.3f}" if isinstance(v, float) else str(v) for k, v in saved["stats"].items()}
    assert sum(ln.startswith("stats: ") for ln in out) == 1


def test_the_cli_bounds_the_openmp_spin_before_torch_loads(default_run):
    assert default_run[2] == [["<unset>", "10000"]]


def test_a_wait_policy_the_user_set_is_kept_and_no_spin_count_is_added(tmp_path):
    assert solve(tmp_path, env_policy="ACTIVE")[2] == [["ACTIVE", "<unset>"]]


def test_load_model_bounds_the_spin_when_torch_is_not_loaded_yet():
    proc = spy("from treesearch.models.load import load_model; load_model('tiny')")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert policy_seen(proc) == [["<unset>", "10000"]]
    kept = spy("from treesearch.models.load import load_model; load_model('tiny')", env_policy="active")
    assert policy_seen(kept) == [["active", "<unset>"]]


def test_a_spin_count_the_user_set_is_kept():
    from treesearch.common.threads import bounded_openmp_wait

    env = {"GOMP_SPINCOUNT": "0"}
    assert bounded_openmp_wait(env) is False and env == {"GOMP_SPINCOUNT": "0"}


def test_nothing_is_set_once_torch_is_loaded():
    import torch  # noqa: F401  (loaded: a policy set now would have no effect)

    from treesearch.common.threads import bounded_openmp_wait

    env: dict[str, str] = {}
    assert bounded_openmp_wait(env) is False and env == {}
