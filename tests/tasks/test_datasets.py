"""The shipped benchmark test splits load completely and correctly, and letters parse as intended."""

from __future__ import annotations

from collections import Counter
from importlib import resources

import pytest

from treesearch.tasks.choice import extract_choice
from treesearch.tasks.datasets import load_arc, load_gsm8k, load_mmlu_stem, mmlu_stem_subjects


def test_gsm8k_test_split_is_complete_with_final_numbers():
    items = load_gsm8k()
    assert len(items) == 1319
    assert items[0].question.startswith("Janet’s ducks lay 16 eggs per day.")
    assert items[0].answer == "18"
    assert all(it.answer and "####" in it.solution for it in items)


def test_gsm8k_range_is_a_slice_of_the_file_order():
    assert [it.question for it in load_gsm8k(5, 8)] == [it.question for it in load_gsm8k()[5:8]]
    with pytest.raises(ValueError, match="bad row range"):
        load_gsm8k(4, 2)


def test_arc_normalises_numeric_labels_and_odd_choice_counts():
    items = load_arc()
    assert len(items) == 1172
    assert Counter(len(it.choices) for it in items) == {4: 1165, 3: 4, 5: 3}
    by_id = {it.id: it for it in items}
    assert len(by_id) == 1172
    assert by_id["NYSEDREGENTS_2008_8_34"].answer == "B"  # key "2" among labels 1-4
    assert by_id["NYSEDREGENTS_2012_8_42"].answer == "B"  # key "2" among labels 1-3
    assert by_id["NYSEDREGENTS_2012_8_42"].letters == "ABC"
    assert by_id["TIMSS_1995_8_J7"].letters == "ABCDE" and by_id["TIMSS_1995_8_J7"].answer == "D"
    assert items[0].id == "Mercury_7175875" and items[0].answer == "C"
    assert all(it.answer in it.letters for it in items)


def test_mmlu_stem_has_18_subjects_and_3018_rows_read_with_csv():
    subjects = mmlu_stem_subjects()
    assert len(subjects) == 18 and subjects[0] == "abstract_algebra" and subjects[-1] == "machine_learning"
    items = load_mmlu_stem()
    assert len(items) == 3018
    counts = Counter(it.subject for it in items)
    assert counts["elementary_mathematics"] == 378 and counts["machine_learning"] == 112
    assert all(len(it.choices) == 4 and it.answer in "ABCD" for it in items)
    first = items[0]
    assert first.choices == ("0", "4", "2", "6") and first.answer == "B"
    # a quoted question with newlines and commas stays one row
    chem = load_mmlu_stem(subjects=["college_chemistry"])
    assert len(chem) == 100
    assert chem[3].question.startswith(
        "When the following equation is balanced, which of the following is true?\n"
    )
    assert chem[3].answer == "B"
    with pytest.raises(ValueError, match="unknown MMLU STEM subject"):
        load_mmlu_stem(subjects=["anatomy"])


def test_each_dataset_ships_its_license_and_source():
    data = resources.files("treesearch.tasks").joinpath("data")
    for folder, phrase in (
        ("gsm8k", "MIT License"),
        ("arc_challenge", "CC BY-SA 4.0"),
        ("mmlu_stem", "MIT License"),
    ):
        assert phrase in data.joinpath(folder, "LICENSE").read_text()
        assert "Origin:" in data.joinpath(folder, "SOURCE.md").read_text()


@pytest.mark.parametrize(
    "text, letters, expected",
    [
        ("so the answer is (B).", "ABCD", "B"),
        ("Answer: C", "ABCD", "C"),
        ("(A) is wrong because ... (D) fits", "ABCD", "D"),
        ("A ball falls. C. is right", "ABCDE", "C"),
        ("The answer is (E).", "ABCD", None),  # E is not a choice of a 4-choice question
        ("A ball falls down.", "ABCD", None),
        ("no letter here", "ABCD", None),
    ],
)
def test_extract_choice(text, letters, expected):
    assert extract_choice(text, letters) == expected
