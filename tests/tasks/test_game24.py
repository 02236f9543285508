"""Game of 24: the exact answer checker, move parsing, and the task's prompts and states."""

from __future__ import annotations

from fractions import Fraction

import pytest

from treesearch.common.errors import ParseError
from treesearch.tasks.arith import evaluate, parse_number
from treesearch.tasks.game24 import Game24, Game24State, apply_move, check_answer, load_puzzles


@pytest.mark.parametrize(
    "expr,puzzle",
    [
        ("(6 - 4) * (4 + 8)", "4 4 6 8"),
        ("(10 - 6) * 5 + 4 = 24", "4 5 6 10"),
        ("1 * 2 * 3 * 4", "4 3 2 1"),
        ("8 / (3 - 8 / 3)", "3 3 8 8"),
        ("(1 + 1 + 4) * 4", "1 1 4 4"),
    ],
)
def test_checker_accepts_correct_expressions(expr, puzzle):
    assert check_answer(expr, puzzle)


@pytest.mark.parametrize(
    "expr,puzzle,why",
    [
        ("(6 - 4) * (4 + 9)", "4 4 6 8", "wrong numbers"),
        ("6 * 4", "4 4 6 8", "numbers not all used"),
        ("(6 - 4) * (4 + 8) + 8 - 8", "4 4 6 8", "a number used twice"),
        ("24 / (4 - 4) + 6 + 8", "4 4 6 8", "division by zero"),
        ("(6 - 4) * (4 + 8) - 1", "4 4 6 8", "does not equal 24"),
        ("__import__('os').system('ls')", "4 4 6 8", "hostile code"),
        ("4 ** 4 + 6 + 8", "4 4 6 8", "power is not an allowed operator"),
        ("", "4 4 6 8", "empty"),
    ],
)
def test_checker_rejects(expr, puzzle, why, monkeypatch):
    import builtins

    def boom(*a, **k):
        raise AssertionError("model output must never be evaluated")

    monkeypatch.setattr(builtins, "eval", boom)
    monkeypatch.setattr(builtins, "exec", boom)
    assert not check_answer(expr, puzzle), why


def test_evaluate_is_exact_fraction_arithmetic():
    ev = evaluate("8 / (3 - 8 / 3)")
    assert ev.value == Fraction(24) and ev.numbers == (8, 3, 8, 3)
    with pytest.raises(ParseError):
        evaluate("1 / 0")
    with pytest.raises(ParseError):
        evaluate("(" * 40 + "1" + ")" * 40)
    assert parse_number("7/3") == Fraction(7, 3)


def test_apply_move_recomputes_result_and_remaining_numbers():
    nums = tuple(Fraction(x) for x in (4, 5, 6, 10))
    thought, left = apply_move(nums, "4 + 5 = 10 (left: 1 2 3)")  # the model's arithmetic is wrong
    assert thought == "4 + 5 = 9 (left: 6 9 10)"
    assert left == (6, 9, 10)
    assert apply_move(nums, "9 - 7 = 2 (left: 2 3 10)") is None  # 9 and 7 are not available
    assert apply_move(nums, "10 / 0 = 0") is None
    thought, left = apply_move(nums, "10 / 4 = 2.5")
    assert left == (Fraction(5, 2), 5, 6) and thought == "10 / 4 = 5/2 (left: 5/2 5 6)"


def test_parse_children_and_answer_step():
    g = Game24()
    root = g.initial_state("4 5 6 10")
    kids = g.parse_children(root, "4 + 5 = 9 (left: 6 9 10)\n6 * 4 = 24 (left: 5 10 24)\nnonsense\n")
    assert [k.thought for k in kids] == ["4 + 5 = 9 (left: 6 9 10)", "6 * 4 = 24 (left: 5 10 24)"]
    s = root
    for line in ("10 - 6 = 4", "4 * 5 = 20", "20 + 4 = 24"):
        s = g.parse_children(s, line)[0].state
    assert s.numbers == (24,)
    assert "Answer:" in g.expand_prompt(s)
    final = g.parse_children(s, " (10 - 6) * 5 + 4 = 24\n")[0].state
    assert g.is_terminal(final) and g.is_solved(final) and g.value(final) == 20.0
    assert g.answer(final) == "(10 - 6) * 5 + 4 = 24"
    wrong = g.parse_children(s, " 4 * 6 = 24\n")[0].state
    assert g.is_terminal(wrong) and not g.is_solved(wrong) and g.value(wrong) == 0.001


def test_the_answer_is_the_answer_line_as_the_model_wrote_it():
    """The answer shown and saved is the node's own line, never rewritten to "= 24"; the reason it is
    not a solution says what the expression equals."""
    g = Game24()
    s = g.initial_state("1 3 7 14")
    for line in ("3 * 7 = 21", "14 + 1 = 15", "21 * 15 = 315"):
        s = g.parse_children(s, line)[0].state
    kid = g.parse_children(s, " (3 * 7) * (14 + 1) = 34 (left: 34 14)\n")[0]
    assert kid.thought == "Answer: (3 * 7) * (14 + 1) = 34 (left: 34 14)"
    assert g.answer(kid.state) == "(3 * 7) * (14 + 1) = 34 (left: 34 14)"
    assert g.rejection_reason(kid.state) == "equals 315, not 24" and not g.is_solved(kid.state)
    assert g.state_from_json(g.state_to_json(kid.state)) == kid.state
    hand = Game24State(puzzle=(4, 5, 6, 10), numbers=(Fraction(24),), answer="(10 - 6) * 5 + 4")
    assert g.answer(hand) == "(10 - 6) * 5 + 4"  # no line written: the expression, nothing added


def test_state_json_round_trip():
    g = Game24()
    s = g.parse_children(g.initial_state("4 5 6 10"), "10 / 4 = 2.5")[0].state
    assert g.state_from_json(g.state_to_json(s)) == s


def test_test_set_is_rows_900_to_999():
    puzzles = load_puzzles()
    assert len(puzzles) == 100
    assert (puzzles[0], puzzles[1], puzzles[-1]) == ("4 5 6 10", "1 2 4 7", "4 9 10 13")
