"""GSM8K as a chain-style problem: `extract_number` reads the final answer (after "answer is" or
"####", else the last number; normalised), prompts extend the parent's context, one step per child,
a stated answer ends the branch, and states survive a JSON round trip."""

from __future__ import annotations

import pytest

from treesearch.common.errors import ParseError
from treesearch.tasks.gsm8k import GSM8K, PROMPT, VALUE_SUFFIX, GSM8KState, extract_number

Q = "Tom has 3 boxes of 4 apples and eats 2. How many are left?"


@pytest.mark.parametrize(
    "text,want",
    [
        ("Step: 12 * 3 = 36. The answer is 36.", "36"),
        ("The answer is 5 but later 9", "5"),  # the stated answer, not the last number
        ("The Answer is 2,000,000.", "2000000"),
        ("answer is $-4.50", "-4.5"),
        ("#### 1,234", "1234"),  # the dataset's answer format
        ("She has 3 apples, then 7.0 apples", "7"),  # no stated answer: the last number
        ("10.00", "10"),
        ("she has 16.", "16"),
        ("no digits here", None),
        ("#### ", None),
        (42, None),
    ],
)
def test_extract_number_reads_the_final_answer(text, want):
    assert extract_number(text) == want


@pytest.mark.parametrize("bad", ["", "   ", {"question": ""}, {"answer": "#### 3"}, 3, None])
def test_check_input_refuses_what_is_not_a_word_problem(bad):
    with pytest.raises(ParseError, match="a GSM8K input is a word problem"):
        GSM8K().check_input(bad)


def test_check_input_takes_text_or_a_dataset_row_and_the_row_gives_the_gold_answer():
    p = GSM8K()
    p.check_input(Q)
    p.check_input({"question": Q, "answer": "3 * 4 = 12 - 2 = 10\n#### 1,000"})
    assert p.initial_state({"question": f"  {Q} ", "answer": "#### 1,000"}) == GSM8KState(Q, gold="1000")
    assert p.initial_state(f" {Q}\n") == GSM8KState(Q)


def test_prompts_extend_the_context_so_a_child_reuses_its_parents():
    p = GSM8K()
    parent = GSM8KState(Q, steps=("3 * 4 = 12 apples.",))
    assert p.context(parent) == PROMPT.format(question=Q) + "Step: 3 * 4 = 12 apples.\n"
    assert p.expand_prompt(parent) == p.context(parent) + "Step:"
    assert p.value_prompt(parent) == PROMPT.format(question=Q) + "Step: 3 * 4 = 12 apples." + VALUE_SUFFIX
    (child,) = p.parse_children(parent, " 12 - 2 = 10 apples are left.\nStep: The answer is 10.")
    assert child.thought == "12 - 2 = 10 apples are left."  # one step: the first line
    assert child.state.steps == ("3 * 4 = 12 apples.", "12 - 2 = 10 apples are left.")
    assert child.state.answer is None
    assert p.expand_prompt(child.state).startswith(p.expand_prompt(parent))
    assert p.value_prompt(child.state).startswith(p.context(parent))


def test_a_stated_answer_ends_the_branch_and_solves_it_when_it_matches_the_gold():
    p = GSM8K(max_steps=3)
    root = p.initial_state({"question": Q, "answer": "#### 10"})
    (done,) = p.parse_children(root, "  The answer is 10.\n")
    assert done.state.answer == "10" and p.answer(done.state) == "10"
    assert p.is_terminal(done.state) and p.is_solved(done.state)
    (wrong,) = p.parse_children(root, "The answer is 12.")
    assert p.is_terminal(wrong.state) and not p.is_solved(wrong.state)
    (no_gold,) = p.parse_children(p.initial_state(Q), "The answer is 10.")
    assert not p.is_solved(no_gold.state)  # nothing to compare with


def test_the_answer_is_the_number_as_the_step_writes_it():
    """The answer shown and saved is the number as the node's thought writes it ("1,000"); the
    comparison with the reference uses its normalised form (1000)."""
    p = GSM8K()
    root = p.initial_state({"question": Q, "answer": "#### 1000"})
    (done,) = p.parse_children(root, " So the answer is $1,000.\n")
    assert done.thought == "So the answer is $1,000."
    assert p.answer(done.state) == "1,000" and done.state.answer == "1000" and p.is_solved(done.state)
    cot = p.parse_cot(root, " 4 * 250 = 1,000.00 dollars in all.")
    assert p.answer(cot) == "1,000.00" and cot.answer == "1000" and p.is_solved(cot)
    assert p.answer(GSM8KState(Q, answer="7")) == "7"  # no step writes it: the number itself


def test_a_branch_ends_at_max_steps_and_blank_text_gives_no_child():
    p = GSM8K(max_steps=2)
    one = GSM8KState(Q, steps=("a",))
    assert not p.is_terminal(one) and p.is_terminal(GSM8KState(Q, steps=("a", "b")))
    assert p.parse_children(one, "   \n  ") == []
    assert p.parse_children(one, "\n  next step\n")[0].thought == "next step"
    assert p.state_key(GSM8KState(Q, steps=("a", "b"))) == "a\nb"


def test_state_json_round_trip_and_files_without_a_gold_answer():
    p = GSM8K()
    state = GSM8KState(Q, steps=("a", "The answer is 10."), answer="10", gold="10")
    data = p.state_to_json(state)
    assert data == {"question": Q, "steps": ["a", "The answer is 10."], "answer": "10", "gold": "10"}
    assert p.state_from_json(data) == state
    del data["gold"]  # written before the gold answer was kept
    assert p.state_from_json(data) == GSM8KState(Q, steps=("a", "The answer is 10."), answer="10")
