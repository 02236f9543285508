"""Why an answer is not a solution, as the tasks say it (`Problem.rejection_reason`): Game of 24
names the check an expression failed, GSM8K the reference answer; a Problem that gives no reason
still works (None)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from treesearch import Problem
from treesearch.tasks.game24 import Game24, answer_rejection, check_answer
from treesearch.tasks.gsm8k import GSM8K, GSM8KState


@pytest.mark.parametrize(
    "expr,puzzle,reason",
    [
        ("(12 * 6) * (10 - 9) = 24", "4 5 6 10", "uses 12 and 9, which the puzzle does not have"),
        ("(4 + 4) * (6 - 8) * 3", "4 4 6 8", "uses 3, which the puzzle does not have"),
        ("(1 + 2 + 3) * 4 = 24", "4 5 6 10", "uses 1, 2 and 3, which the puzzle does not have"),
        ("4 * 4 * 6 / (5 - 10)", "4 5 6 10", "uses 4 twice, the puzzle has it once"),
        ("(6 - 4) * (4 + 8) + 8 - 8", "4 4 6 8", "uses 8 3 times, the puzzle has it once"),
        ("4 * 6", "4 5 6 10", "does not use 5 and 10 (each puzzle number is used once)"),
        ("6 * 4 + 8", "4 4 6 8", "does not use 4 (each puzzle number is used once)"),
        ("4 + 5 + 6 + 10", "4 5 6 10", "equals 25, not 24"),
        ("(10 - 4) / 5 + 6", "4 5 6 10", "equals 36/5, not 24"),
        (
            "4 ** 4 + 6 + 8",
            "4 4 6 8",
            "cannot evaluate '4 ** 4 + 6 + 8' (unexpected '*')",
        ),
        ("24 / (4 - 4) + 6 + 8", "4 4 6 8", "cannot evaluate '24 / (4 - 4) + 6 + 8' (division by zero)"),
        ("4 * (5 +", "4 5 6 10", "cannot evaluate '4 * (5 +' (expression ends too early)"),
    ],
)
def test_game24_says_which_check_an_answer_failed(expr, puzzle, reason):
    assert answer_rejection(expr, puzzle) == reason
    assert check_answer(expr, puzzle) is False


@pytest.mark.parametrize(
    "expr,puzzle", [("(10 - 6) * 5 + 4 = 24", "4 5 6 10"), ("8 / (3 - 8 / 3)", "3 3 8 8")]
)
def test_game24_gives_no_reason_for_a_solution(expr, puzzle):
    assert answer_rejection(expr, puzzle) is None and check_answer(expr, puzzle) is True


def test_game24_rejection_reason_reads_the_states_answer():
    p = Game24()
    state = p.initial_state("4 5 6 10")
    assert p.rejection_reason(state) is None  # no answer stated yet
    answered = type(state)(puzzle=state.puzzle, numbers=(Fraction(24),), answer="(12 * 6) * (10 - 9)")
    assert p.rejection_reason(answered) == "uses 12 and 9, which the puzzle does not have"


def test_gsm8k_names_the_reference_answer_or_its_absence():
    p = GSM8K()
    assert p.rejection_reason(GSM8KState("q", answer="14", gold="16")) == (
        "the answer is 14, the reference answer is 16"
    )
    assert p.rejection_reason(GSM8KState("q", answer="14")) == (
        'no reference answer to check it against (give {"question": ..., "answer": ...})'
    )
    assert p.rejection_reason(GSM8KState("q", answer="16", gold="16")) is None
    assert p.rejection_reason(GSM8KState("q")) is None


def test_a_problem_without_rejection_reason_gives_none():
    class Own(Problem):
        def expand_prompt(self, state):
            return str(state)

        def parse_children(self, state, text):
            return []

        def value(self, state):
            return 0.0

    assert Own().rejection_reason("anything") is None


def test_score_legends_say_what_a_score_is():
    class Labelled(Problem):
        labels = {" yes": 1.0, " no": 0.0}
        value_range = (0.0, 1.0)

        def value_prompt(self, state):
            return "ok?"

    class Programmatic(Problem):
        value_range = (-1.0, 1.0)

    assert (
        GSM8K().score_legend()
        == "score: value estimate in [0, 1], the expected weight of the model's label (yes=1, no=0)"
    )
    assert (
        Labelled().score_legend()
        == "score: value estimate in [0, 1], the expected weight of the model's label (yes=1, no=0)"
    )
    assert Programmatic().score_legend() == "score: Programmatic.value(state) in [-1, 1]"
    assert Problem().score_legend() == "score: Problem.value(state)"
    assert Game24().score_legend() == (
        "score: value in [0, 20], the model's judgement of the numbers left (sure=20, likely=1, "
        "impossible=0.001); an answer: 20 if right, 0.001 if wrong"
    )
