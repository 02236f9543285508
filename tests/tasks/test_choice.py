"""`extract_choice`: an explicit "answer is (X)" / "Answer: X" wins, else the last marked letter
("(X)", "X." or "X)") among the allowed ones, else None; a capital letter inside prose is no answer."""

from __future__ import annotations

import pytest

from treesearch.tasks.choice import extract_choice


@pytest.mark.parametrize(
    "text,letters,want",
    [
        ("The answer is (B).", "ABCD", "B"),
        ("Answer: C", "ABCD", "C"),
        ("the answer is (a)", "ABCD", "A"),  # lower case counts inside parentheses
        ("I think the answer is B, not (C)", "ABCD", "B"),  # explicit beats marked
        ("A ball falls. (C) is right", "ABCD", "C"),  # "A ball" is prose, "(C)" is marked
        ("(A) first, then (D)", "ABCD", "D"),  # the last marked letter
        ("B. is wrong; D) maybe", "ABCD", "D"),
        ("The answer is E", "ABCDE", "E"),
    ],
)
def test_the_answer_letter_is_read(text, letters, want):
    assert extract_choice(text, letters) == want


@pytest.mark.parametrize(
    "text,letters",
    [
        ("The answer is (D)", "ABC"),  # not one of this question's letters
        ("answer: c", "ABCD"),  # a bare lower-case letter is a word, not a choice
        ("the answer is a good one", "ABCD"),
        ("A ball falls", "ABCD"),
        (None, "ABCD"),
        (42, "ABCD"),
    ],
)
def test_no_answer_letter_gives_none(text, letters):
    assert extract_choice(text, letters) is None


def test_only_the_first_10000_characters_are_read():
    assert extract_choice("x " * 5_000 + "(B)") is None
    assert extract_choice("x " * 4_000 + "(B)") == "B"
