"""Countdown (`treesearch.tasks.countdown`): inputs, exact step checking of the model's move lines
(wrong arithmetic and numbers not available are dropped, never corrected), answers built in code,
the seeded generator and exact solver behind the shipped instances, and one real search."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from treesearch.common.errors import ParseError
from treesearch.tasks import TASKS, Countdown
from treesearch.tasks.countdown import answer_rejection, apply_step, load_instances, parse_input
from treesearch.tasks.countdown_data import generate, reachable, solve

ROOT = Path(__file__).resolve().parents[2]


def test_inputs_in_either_order_or_as_a_row():
    assert parse_input("target: 10; numbers: 2 3 4") == (10, (2, 3, 4))
    assert parse_input("Numbers: 2, 3, 4, 5 ; Target: 24") == (24, (2, 3, 4, 5))
    assert parse_input({"target": 7, "numbers": [1, 6]}) == (7, (1, 6))
    assert TASKS["countdown"] is Countdown


@pytest.mark.parametrize(
    "bad, message",
    [
        ("2 3 4 -> 10", 'a Countdown input is "target: 10; numbers: 2 3 4"'),
        ("target: ten; numbers: 2 3 4", "the Countdown target must be a whole number"),
        ("target: 10; numbers: 2", "Countdown numbers are 2 to 6 whole numbers"),
        ("target: 10; numbers: 1 2 3 4 5 6 7", "Countdown numbers are 2 to 6 whole numbers"),
        ("target: 10; numbers: 2 3.5 4", "Countdown numbers are 2 to 6 whole numbers"),
        ({"numbers": [1, 2]}, "a Countdown input is"),
        (42, "a Countdown input is"),
    ],
)
def test_bad_inputs_say_what_is_expected(bad, message):
    with pytest.raises(ParseError, match=message):
        parse_input(bad)


def test_each_move_line_is_checked_exactly_and_wrong_ones_are_dropped():
    p = Countdown()
    root = p.initial_state("target: 24; numbers: 2 3 4 6")
    text = (
        "2 + 3 = 5 (left: 4 5 6)\n"  # right
        "4 * 6 = 25 (left: 2 3 25)\n"  # wrong result: dropped, not corrected
        "7 - 3 = 4 (left: 2 4 6)\n"  # 7 is not available
        "3 * 3 = 9 (left: 2 4 9)\n"  # only one 3
        "6 / 4 = 3/2 (left: 3/2 2 3)\n"  # right, a fraction
        "6 - 2 = 4 (left: whatever)\n"  # right: the model's own (left: ...) is not trusted
        "4 x 6 = 24\n"  # right, x for *
        "so 2 + 3 = 5\n"  # not a move line
        "2 + 3 = 5 (left: 4 5 6)\n"  # right again (the searcher merges equal states)
    )
    kids = p.parse_children(root, text)
    assert [c.thought for c in kids] == [
        "2 + 3 = 5 (left: 4 5 6)",
        "6 / 4 = 3/2 (left: 3/2 2 3)",
        "6 - 2 = 4 (left: 3 4 4)",
        "4 * 6 = 24 (left: 2 3 24)",
        "2 + 3 = 5 (left: 4 5 6)",
    ]
    assert [c.span for c in kids[:2]] == [(0, 23), (text.index("6 / 4"), text.index("6 / 4") + 27)]
    assert kids[1].state.values() == (Fraction(3, 2), Fraction(2), Fraction(3))
    assert apply_step(root, "3 / 0 = 0") is None


def test_the_answer_is_built_in_code_from_the_verified_steps():
    """The answer states the value its steps reach, never the target it was meant to reach."""
    p = Countdown()
    s = p.initial_state("target: 24; numbers: 2 3 4 6")
    for line in ["6 - 2 = 4 (left: 3 4 4)", "4 * 3 = 12", "12 + 4 = 16"]:
        s = p.parse_children(s, line)[0].state
    assert p.is_terminal(s) and not p.is_solved(s)
    # two 4s are left after 6 - 2: a move takes the first of equal values (the puzzle's 4 sorts first)
    assert p.answer(s) == "(4 * 3) + (6 - 2) = 16" and p.rejection_reason(s) == "equals 16, not 24"
    assert p.value(s) == 0.001
    s = p.initial_state("target: 24; numbers: 2 3 4 6")
    for line in ["2 * 3 = 6", "6 - 4 = 2", "6 * 2 = 12"]:
        s = p.parse_children(s, line)[0].state
    assert not p.is_solved(s)  # 12, not 24
    s = p.initial_state("target: 24; numbers: 2 3 4 6")
    for line in ["4 - 2 = 2", "3 * 6 = 18", "18 + 2 = 20"]:
        s = p.parse_children(s, line)[0].state
    assert p.answer(s) == "(3 * 6) + (4 - 2) = 20" and not p.is_solved(s)
    s = p.initial_state("target: 24; numbers: 2 3 4 6")
    for line in ["3 - 2 = 1", "4 * 6 = 24", "24 * 1 = 24"]:
        s = p.parse_children(s, line)[0].state
    assert p.is_solved(s) and p.answer(s) == "(4 * 6) * (3 - 2) = 24" and p.value(s) == 20.0
    assert p.state_from_json(p.state_to_json(s)) == s


def test_answer_rejection_reasons():
    puzzle = (2, 3, 4)
    assert answer_rejection("(2 + 3) * 4", puzzle, 20) is None
    assert answer_rejection("(2 + 3) * 4 = 20", puzzle, 20) is None
    assert answer_rejection("2 * 3 * 5", puzzle, 30) == "uses 5, which the puzzle does not have"
    assert answer_rejection("2 * 2 * 3", puzzle, 12) == "uses 2 more often than the puzzle has it"
    assert answer_rejection("2 * 3", puzzle, 6) == "does not use 4 (each number is used once)"
    assert answer_rejection("2 + 3 + 4", puzzle, 10) == "equals 9, not 10"
    assert answer_rejection("import os", puzzle, 10).startswith("cannot evaluate")


def test_chain_of_thought_answer_line():
    p = Countdown()
    root = p.initial_state("target: 20; numbers: 2 3 4")
    s = p.parse_cot(root, "2 + 3 = 5 (left: 4 5)\n5 * 4 = 20 (left: 20)\nAnswer: (2 + 3) * 4 = 20\n")
    assert p.is_solved(s) and p.answer(s) == "(2 + 3) * 4 = 20"
    assert p.parse_cot(root, "2 + 3 = 5\nAnswer: no") == root
    assert not p.is_solved(p.parse_cot(root, "Answer: 2 * 3 * 4 = 20"))


# -- instances ------------------------------------------------------------------------------------
def test_the_generator_is_a_function_of_its_seed():
    assert generate(0, 3, 3) == generate(0, 3, 3)
    assert generate(0, 3, 3) != generate(1, 3, 3)
    assert generate(0, 3, 3) == GENERATED


GENERATED = [
    {"target": 96, "numbers": [4, 4, 12], "solution": "(4 + 4) * 12 = 96"},
    {"target": 72, "numbers": [7, 11, 4], "solution": "4 * (7 + 11) = 72"},
    {"target": 41, "numbers": [8, 11, 3], "solution": "8 + (3 * 11) = 41"},
]


def test_shipped_instances_are_the_generators_and_each_has_a_checked_solution():
    rows = load_instances()
    assert [len(r["numbers"]) for r in rows] == [3] * 200 + [4] * 200 + [5] * 200
    assert rows[:200] == generate(0, 3, 200) and rows[200:400] == generate(0, 4, 200)
    assert rows[400:410] == generate(0, 5, 10)  # the generator draws in order: a prefix is the same
    assert len({(tuple(sorted(r["numbers"])), r["target"]) for r in rows}) == 600
    for r in rows:
        assert 10 <= r["target"] <= 100 and all(1 <= v <= 13 for v in r["numbers"])
        expr, _, target = r["solution"].rpartition(" = ")
        assert int(target) == r["target"] and answer_rejection(expr, tuple(r["numbers"]), r["target"]) is None
    assert load_instances(4) == rows[200:400]


def test_the_solver_finds_a_solution_for_shipped_instances_and_knows_the_unreachable():
    rows = load_instances()
    for r in rows[:400] + rows[400:430]:
        expr = solve(r["numbers"], r["target"])
        assert expr is not None and answer_rejection(expr, tuple(r["numbers"]), r["target"]) is None
    assert solve([1, 1], 7) is None and solve([2, 3], 6) == "2 * 3"
    assert set(reachable((1, 1))) == {Fraction(2), Fraction(1), Fraction(0)}


def test_the_data_file_is_what_the_documented_command_writes(tmp_path):
    out = tmp_path / "c.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "countdown-data"),
            "--seed",
            "0",
            "--sizes",
            "3",
            "--count",
            "5",
        ]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    import json

    assert [json.loads(x) for x in out.read_text().splitlines()] == load_instances()[:5]


# -- CLI and a real search --------------------------------------------------------------------------
def test_cli_refuses_a_bad_countdown_input_in_one_line_before_the_model_loads():
    done = subprocess.run(
        [sys.executable, "-m", "treesearch.cli.main", "solve", "countdown", "10 from 2 3 4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith('treesearch: error: bad countdown input: a Countdown input is "target: 10;')


@pytest.mark.real_model
def test_bfs_on_countdown_with_the_default_model_keeps_only_verified_steps(real_lm):
    from strategies import BFS
    from treesearch import Searcher

    p = Countdown()
    r = Searcher(real_lm, p, BFS(breadth=3), progress=False).solve("target: 20; numbers: 2 3 4")
    tree = r.tree
    assert len(tree) > 1 and tree.node(0)["status"] == "expanded"
    for n in tree.graph:
        if n == 0:
            continue
        d = tree.node(n)
        parent = tree.node(tree.parent(n))["state"]
        line = d["thought"]
        assert apply_step(parent, line) is not None  # every child is a right move from its parent
        if p.is_terminal(d["state"]):
            assert d["score"] in (20.0, 0.001) and d["solved"] == (d["score"] == 20.0)
    if r.solved:
        assert answer_rejection(r.answer, (2, 3, 4), 20) is None
