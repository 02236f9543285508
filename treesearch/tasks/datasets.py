"""Loaders for the benchmark test splits shipped in `treesearch/tasks/data/` (each folder holds its
SOURCE.md and LICENSE): GSM8K (MIT), ARC-Challenge (CC BY-SA 4.0) and the 18 MMLU STEM subjects (MIT).

Rows are returned in file order (MMLU: subjects in alphabetical order, rows in file order), so an
index range names the same questions on every machine. Multiple-choice rows are normalised to
letters: the i-th choice is shown as "ABCDE"[i] and the answer is the letter of the choice whose
label is the answer key. ARC has 22 rows labelled 1-4 instead of A-D and rows with 3 or 5 choices;
MMLU CSVs have no header and quote fields with commas or newlines, so they are read with `csv`.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from importlib import resources

from treesearch.tasks.gsm8k import extract_number

LETTERS = "ABCDE"


@dataclass(frozen=True)
class MathItem:
    """A GSM8K question, its worked solution and the final number (as `extract_number` writes it)."""

    question: str
    solution: str
    answer: str


@dataclass(frozen=True)
class ChoiceItem:
    """A multiple-choice question with choices lettered A.. in order and the correct letter."""

    id: str
    question: str
    choices: tuple[str, ...]
    answer: str
    subject: str = ""

    @property
    def letters(self) -> str:
        return LETTERS[: len(self.choices)]


def _data(path: str) -> str:
    return resources.files("treesearch.tasks").joinpath("data", path).read_text(encoding="utf-8")


def _slice(rows: list, start: int, end: int | None) -> list:
    if start < 0 or (end is not None and end < start):
        raise ValueError(f"bad row range {start}:{end}; use 0 <= START <= END")
    return rows[start:end]


def load_gsm8k(start: int = 0, end: int | None = None) -> list[MathItem]:
    """GSM8K test rows [start, end) (1319 rows in all)."""
    items = []
    for line in _data("gsm8k/test.jsonl").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        answer = extract_number(row["answer"].split("####")[-1])
        if answer is None:
            raise ValueError(f"GSM8K row without a final number after ####: {row['answer'][-60:]!r}")
        items.append(MathItem(question=row["question"], solution=row["answer"], answer=answer))
    return _slice(items, start, end)


def load_arc(start: int = 0, end: int | None = None) -> list[ChoiceItem]:
    """ARC-Challenge test rows [start, end) (1172 rows; 3, 4 or 5 choices; keys A-E or 1-4)."""
    items = []
    for line in _data("arc_challenge/ARC-Challenge-Test.jsonl").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        choices = row["question"]["choices"]
        labels = [c["label"] for c in choices]
        if row["answerKey"] not in labels or len(choices) > len(LETTERS):
            raise ValueError(
                f"ARC row {row['id']}: answer key {row['answerKey']!r} not among labels {labels}"
            )
        items.append(
            ChoiceItem(
                id=row["id"],
                question=row["question"]["stem"],
                choices=tuple(c["text"] for c in choices),
                answer=LETTERS[labels.index(row["answerKey"])],
            )
        )
    return _slice(items, start, end)


def mmlu_stem_subjects() -> list[str]:
    """The 18 MMLU STEM subjects shipped, in alphabetical order."""
    folder = resources.files("treesearch.tasks").joinpath("data", "mmlu_stem", "test")
    return sorted(p.name[: -len("_test.csv")] for p in folder.iterdir() if p.name.endswith("_test.csv"))


def load_mmlu_stem(
    start: int = 0, end: int | None = None, subjects: list[str] | None = None
) -> list[ChoiceItem]:
    """MMLU STEM test rows [start, end) over the subjects (default all 18, alphabetical; 3018 rows)."""
    known = mmlu_stem_subjects()
    chosen = known if subjects is None else list(subjects)
    for s in chosen:
        if s not in known:
            raise ValueError(f"unknown MMLU STEM subject {s!r}; choose from {', '.join(known)}")
    items = []
    for subject in chosen:
        text = _data(f"mmlu_stem/test/{subject}_test.csv")
        for i, row in enumerate(csv.reader(io.StringIO(text, newline=""))):
            if len(row) != 6 or row[5] not in "ABCD":
                raise ValueError(
                    f"MMLU {subject} row {i}: expected question, 4 choices, letter; got {row!r:.120}"
                )
            items.append(
                ChoiceItem(
                    id=f"{subject}/{i}",
                    question=row[0],
                    choices=tuple(row[1:5]),
                    answer=row[5],
                    subject=subject,
                )
            )
    return _slice(items, start, end)
