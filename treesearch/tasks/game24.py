"""Game of 24 with the Tree-of-Thoughts protocol (Yao et al., 2023), in this project's own words.

- Steps 1-3 (propose): a one-shot prompt lists moves "a op b = c (left: ...)"; each line whose
  operands are two available numbers becomes a child. The result and the remaining numbers are
  computed exactly (the model's own "= c" and "(left: ...)" are not trusted), so the thought
  shown in the tree is the corrected move.
- Step 4 (answer): from the steps so far, the model writes "Answer: <expression> = 24".
- Value: a few-shot prompt over the remaining numbers, scored at the next token over the labels
  sure / likely / impossible weighted 20 / 1 / 0.001 (expected weight from one forward pass), or
  the original protocol's 3 sampled judgements (`value_mode="sampled"`). A final answer is valued
  by the exact checker: 20 if correct, 0.001 if not.
- Chain of thought (the ToT paper's baseline, `strategies.CoT`): a few-shot prompt of worked
  steps ending in "Answer: <expression> = 24"; the first answer line is the answer.
- The answer checker parses numbers, + - * / and parentheses (`treesearch.tasks.arith`) and
  accepts only expressions that use exactly the four input numbers, each once, and equal 24;
  `answer_rejection` says which check an answer failed.
The test set is rows 900-999 of 24.csv (MIT; see data/24.SOURCE.md).
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from importlib import resources

from treesearch.common.config import Sampling
from treesearch.common.errors import ParseError
from treesearch.core.problem import Child, Problem
from treesearch.tasks.arith import evaluate, fmt, parse_number

PROPOSE_PROMPT = """Combine two of the numbers with +, -, * or / to get a new number. List possible moves, one per line, as "a op b = c (left: remaining numbers)".
Numbers: 3 5 7 9
Moves:
3 + 5 = 8 (left: 7 8 9)
9 - 7 = 2 (left: 2 3 5)
5 * 3 = 15 (left: 7 9 15)
9 / 3 = 3 (left: 3 5 7)
7 + 9 = 16 (left: 3 5 16)
7 - 5 = 2 (left: 2 3 9)
Numbers: {numbers}
Moves:
"""  # noqa: E501  (prompt text: the model sees these lines as they are)

VALUE_PROMPT = """Can the numbers reach 24 with + - * / (each number used once)? Judge sure, likely or impossible.
Numbers: 10 14
Judgement: sure
Numbers: 11 12
Judgement: impossible
Numbers: 4 4 10
Judgement: sure
Numbers: 5 7 8
Judgement: likely
Numbers: 1 3 3
Judgement: impossible
Numbers: 24
Judgement: sure
Numbers: 2 9 10 12
Judgement: likely
Numbers: 1 1 1
Judgement: impossible
Numbers: {numbers}
Judgement:"""  # noqa: E501  (prompt text: the model sees these lines as they are)

ANSWER_PROMPT = """Use every input number exactly once with + - * / to make 24. Write the steps as one expression.
Input: 4 4 6 8
Steps:
4 + 8 = 12 (left: 4 6 12)
6 - 4 = 2 (left: 2 12)
2 * 12 = 24 (left: 24)
Answer: (6 - 4) * (4 + 8) = 24
Input: 2 9 10 12
Steps:
12 * 2 = 24 (left: 9 10 24)
10 - 9 = 1 (left: 1 24)
24 * 1 = 24 (left: 24)
Answer: (12 * 2) * (10 - 9) = 24
Input: {puzzle}
Steps:
{steps}
Answer:"""  # noqa: E501  (prompt text: the model sees these lines as they are)

COT_PROMPT = """Make 24 from the four input numbers with + - * /, using each number exactly once. Work one step at a time: each step combines two of the numbers left into a new one. Then write the whole calculation as one expression.
Input: 1 1 1 8
Steps:
1 + 1 = 2 (left: 1 2 8)
2 + 1 = 3 (left: 3 8)
3 * 8 = 24 (left: 24)
Answer: (1 + 1 + 1) * 8 = 24
Input: 5 5 10 13
Steps:
5 / 5 = 1 (left: 1 10 13)
10 + 13 = 23 (left: 1 23)
23 + 1 = 24 (left: 24)
Answer: (10 + 13) + 5 / 5 = 24
Input: 3 4 6 12
Steps:
12 / 6 = 2 (left: 2 3 4)
3 * 4 = 12 (left: 2 12)
2 * 12 = 24 (left: 24)
Answer: (12 / 6) * (3 * 4) = 24
Input: 1 4 4 10
Steps:
10 - 4 = 6 (left: 1 4 6)
4 * 6 = 24 (left: 1 24)
24 * 1 = 24 (left: 24)
Answer: (10 - 4) * 4 * 1 = 24
Input: 2 12 12 12
Steps:
2 + 12 = 14 (left: 12 12 14)
14 - 12 = 2 (left: 2 12)
2 * 12 = 24 (left: 24)
Answer: (2 + 12 - 12) * 12 = 24
Input: {puzzle}
Steps:
"""  # noqa: E501  (prompt text: the model sees these lines as they are)

LABELS = {" sure": 20.0, " likely": 1.0, " impossible": 0.001}
_NUM = r"(\d+(?:\.\d+)?(?:/\d+)?)"
_MOVE = re.compile(rf"^\s*{_NUM}\s*([+\-*/×x÷])\s*{_NUM}\s*=")
_COT_ANSWER = re.compile(r"^\s*Answer:(.*)$", re.MULTILINE)


@dataclass(frozen=True)
class Game24State:
    """Remaining numbers, the steps taken, the puzzle, and (after step 4) the answer expression
    (what is checked) and the answer line as the model wrote it (what is shown: `Game24.answer`)."""

    puzzle: tuple[int, ...]
    numbers: tuple[Fraction, ...]
    steps: tuple[str, ...] = ()
    answer: str | None = None
    answer_text: str | None = None  # the line after "Answer:", as written ("... = 34 (left: 34)")

    def numbers_text(self) -> str:
        return " ".join(fmt(x) for x in sorted(self.numbers))


def load_puzzles(start: int = 900, end: int | None = 1000) -> list[str]:
    """Puzzles of 24.csv rows [start, end) (the ToT test set is 900-999; end None: to the last row)."""
    text = resources.files("treesearch.tasks").joinpath("data/24.csv").read_text()
    rows = list(csv.DictReader(text.splitlines()))
    return [r["Puzzles"] for r in rows[start:end]]


def parse_puzzle(text: str) -> tuple[int, ...]:
    parts = text.replace(",", " ").split()
    if len(parts) != 4 or not all(p.isascii() and p.isdigit() and len(p) <= 6 for p in parts):
        raise ParseError(f'a Game of 24 puzzle is four whole numbers such as "4 5 6 10", got {text!r}')
    return tuple(int(p) for p in parts)


def check_answer(expression: str, puzzle: tuple[int, ...] | str) -> bool:
    """True iff the expression uses exactly the puzzle's numbers, each once, and equals 24.

    Accepts "expr" or "expr = 24"; never evaluates anything but +, -, *, / over numbers."""
    return answer_rejection(expression, puzzle) is None


def answer_rejection(expression: str, puzzle: tuple[int, ...] | str) -> str | None:
    """Why the expression does not solve the puzzle, in one line; None when it does. The checks,
    first failing one reported: it parses, it uses no number the puzzle lacks, none more often than
    the puzzle has it, every puzzle number, and it equals 24."""
    if isinstance(puzzle, str):
        puzzle = parse_puzzle(puzzle)
    lhs = expression.split("=")[0]
    try:
        ev = evaluate(lhs)
    except ParseError as exc:
        return f"cannot evaluate {lhs.strip()!r:.80} ({exc})"
    have, used = Counter(Fraction(n) for n in puzzle), Counter(ev.numbers)
    foreign = [x for x in used if x not in have]
    if foreign:
        return f"uses {_and(foreign)}, which the puzzle does not have"
    repeated = [x for x in used if used[x] > have[x]]
    if repeated:
        return "; ".join(
            f"uses {fmt(x)} {_times(used[x])}, the puzzle has it {_times(have[x])}" for x in repeated
        )
    missing = list((have - used).elements())
    if missing:
        return f"does not use {_and(missing)} (each puzzle number is used once)"
    if ev.value != 24:
        return f"equals {fmt(ev.value)}, not 24"
    return None


def _and(xs: list[Fraction]) -> str:
    """Numbers in order of first use, as "12", "12 and 9", "1, 2 and 3"."""
    words = [fmt(x) for x in xs]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _times(k: int) -> str:
    return {1: "once", 2: "twice"}.get(k, f"{k} times")


def apply_move(numbers: tuple[Fraction, ...], line: str) -> tuple[str, tuple[Fraction, ...]] | None:
    """Parse "a op b = ..." against the available numbers; the result is computed exactly.
    None unless both operands are available (and no division by zero)."""
    m = _MOVE.match(line)
    if m is None:
        return None
    try:
        a, b = parse_number(m.group(1)), parse_number(m.group(3))
    except ParseError:
        return None
    op = {"×": "*", "x": "*", "÷": "/"}.get(m.group(2), m.group(2))
    pool = list(numbers)
    for x in (a, b):
        if x not in pool:
            return None
        pool.remove(x)
    if op == "/" and b == 0:
        return None
    result = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]
    assert result is not None  # a division by zero returned above
    left = tuple(sorted(pool + [result]))
    thought = f"{fmt(a)} {op} {fmt(b)} = {fmt(result)} (left: {' '.join(fmt(x) for x in left)})"
    return thought, left


class Game24(Problem):
    """The Game of 24 ToT protocol: breadth 5, 4 steps, label-scored values."""

    name = "game24"
    labels = LABELS
    value_range = (0.0, 20.0)
    max_depth = 4

    def __init__(
        self,
        *,
        propose_prompt: str = PROPOSE_PROMPT,
        value_prompt: str = VALUE_PROMPT,
        answer_prompt: str = ANSWER_PROMPT,
        cot_prompt: str = COT_PROMPT,
        value_mode: str = "label",
        max_new_tokens: int = 96,
        cot_max_new_tokens: int = 128,
    ) -> None:
        if value_mode not in ("label", "sampled"):
            raise ValueError(f"value_mode={value_mode!r}; use 'label' (one scoring pass) or 'sampled'")
        self.propose_template = propose_prompt
        self.value_template = value_prompt
        self.answer_template = answer_prompt
        self.cot_template = cot_prompt
        self.value_mode = value_mode
        self.sampling = Sampling(max_new_tokens=max_new_tokens, stop=("\nNumbers:", "\n\n", "Input:"))
        self.cot_sampling = Sampling(max_new_tokens=cot_max_new_tokens, stop=("\nInput:", "\n\n"))

    def check_input(self, x) -> None:
        """Four whole numbers, as text ("4 5 6 10") or a sequence; ParseError otherwise."""
        if isinstance(x, str):
            parse_puzzle(x)
            return
        try:
            parse_puzzle(" ".join(str(v) for v in x))
        except TypeError:
            raise ParseError(
                f'a Game of 24 puzzle is four whole numbers such as "4 5 6 10", got {x!r:.60}'
            ) from None

    def initial_state(self, x) -> Game24State:
        puzzle = parse_puzzle(x) if isinstance(x, str) else tuple(int(v) for v in x)
        return Game24State(puzzle=puzzle, numbers=tuple(sorted(Fraction(v) for v in puzzle)))

    def expand_prompt(self, state: Game24State) -> str:
        if len(state.numbers) == 1:
            return self.answer_template.format(
                puzzle=" ".join(map(str, state.puzzle)), steps="\n".join(state.steps)
            )
        return self.propose_template.format(numbers=state.numbers_text())

    def parse_children(self, state: Game24State, text: str) -> list[Child]:
        """Children from one generation; each carries the character span of the line it came from
        (`Child.span`), so its confidence is that of its own line's tokens (CGEE Level 1)."""
        if len(state.numbers) == 1:
            stripped = text.strip()
            line = stripped.splitlines()[0].rstrip() if stripped else ""
            expr = line.split("=")[0].strip()
            if not expr:
                return []
            start = len(text) - len(text.lstrip())
            return [
                Child(
                    thought=f"Answer: {line}",
                    span=(start, start + len(line)),
                    state=Game24State(
                        puzzle=state.puzzle,
                        numbers=state.numbers,
                        steps=state.steps,
                        answer=expr,
                        answer_text=line,
                    ),
                )
            ]
        children = []
        pos = 0
        for raw in text.splitlines(keepends=True):
            line = raw.splitlines()[0]
            move = apply_move(state.numbers, line)
            if move is not None:
                thought, left = move
                start = pos + len(line) - len(line.lstrip())
                children.append(
                    Child(
                        thought=thought,
                        span=(start, pos + len(line.rstrip())),
                        state=Game24State(puzzle=state.puzzle, numbers=left, steps=state.steps + (thought,)),
                    )
                )
            pos += len(raw)
        return children

    def cot_prompt(self, state: Game24State) -> str:
        """The few-shot chain of thought of the ToT paper's baseline (our examples): the steps,
        then "Answer: <expression> = 24"."""
        return self.cot_template.format(puzzle=" ".join(map(str, state.puzzle)))

    def parse_cot(self, state: Game24State, text: str) -> Game24State:
        """The state of the chain of thought's first "Answer:" line (its expression, checked by
        `is_solved`); the root state itself when the text has no answer line."""
        m = _COT_ANSWER.search(text)
        line = m.group(1).strip() if m else ""
        expr = line.split("=")[0].strip()
        if not expr:
            return state
        return Game24State(puzzle=state.puzzle, numbers=state.numbers, answer=expr, answer_text=line)

    def value_prompt(self, state: Game24State) -> str:
        return self.value_template.format(numbers=state.numbers_text())

    def value(self, state: Game24State) -> float | None:
        if state.answer is not None:
            return 20.0 if check_answer(state.answer, state.puzzle) else 0.001
        return None

    def is_terminal(self, state: Game24State) -> bool:
        return state.answer is not None

    def is_solved(self, state: Game24State) -> bool:
        return state.answer is not None and check_answer(state.answer, state.puzzle)

    def answer(self, state: Game24State) -> str | None:
        """The answer line as the model wrote it ("(3 * 7) * (14 + 1) = 34 (left: 34 14)": the
        node's thought after "Answer: "), never rewritten; `rejection_reason` says what it equals.
        A state built without that text (by hand, or from an older saved file) gives its expression."""
        if state.answer is None:
            return None
        return state.answer_text if state.answer_text is not None else state.answer

    def rejection_reason(self, state: Game24State) -> str | None:
        """Why the state's answer is not a solution (`answer_rejection`), e.g. "uses 12 and 9, which
        the puzzle does not have"."""
        return None if state.answer is None else answer_rejection(state.answer, state.puzzle)

    def score_legend(self) -> str:
        return (
            "score: value in [0, 20], the model's judgement of the numbers left (sure=20, likely=1, "
            "impossible=0.001); an answer: 20 if right, 0.001 if wrong"
        )

    def state_key(self, state: Game24State) -> str:
        return f"{state.numbers_text()}|{state.answer}"

    def state_to_json(self, state: Game24State) -> dict:
        return {
            "puzzle": list(state.puzzle),
            "numbers": [fmt(x) for x in state.numbers],
            "steps": list(state.steps),
            "answer": state.answer,
            "answer_text": state.answer_text,
        }

    def state_from_json(self, data: dict) -> Game24State:
        return Game24State(
            puzzle=tuple(data["puzzle"]),
            numbers=tuple(parse_number(x) for x in data["numbers"]),
            steps=tuple(data["steps"]),
            answer=data["answer"],
            answer_text=data.get("answer_text"),  # files from before the field have none
        )
