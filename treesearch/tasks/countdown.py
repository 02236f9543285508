"""Countdown: reach a target from a few given numbers with + - * /, each number used once (Game of 24
is its four-number case with target 24). The model proposes and values; the problem checks.

- Input: "target: 10; numbers: 2 3 4" (2 to 6 whole numbers), or {"target": 10, "numbers": [2, 3, 4]}.
- Propose: a one-shot prompt lists moves "a op b = c (left: ...)", sampled `samples_per_expand`
  times (3, at temperature 0.7, seeded like every expansion). Each move line is checked in
  code: both operands must be numbers still available and c must be the exact result; a line
  failing either check is dropped (never corrected), so every child is a verified step. The
  expression of each number is kept, so the last step gives the whole answer, built in code.
- Value: a few-shot prompt over the target and the numbers left, scored at the next token over
  sure / likely / impossible weighted 20 / 1 / 0.001; one number left is valued exactly: 20 if
  it is the target, 0.001 if not.
- Chain of thought (`strategies.CoT`, `strategies.SelfConsistency`): a few-shot prompt of worked
  steps ending in "Answer: <expression> = <target>"; the expression is checked by the exact
  arithmetic parser of `treesearch.tasks.arith` (model output is never evaluated as code).
Instances: `treesearch.tasks.countdown_data` (seeded generator, exact solver), shipped in
data/countdown/.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from importlib import resources
from typing import Any

from treesearch.common.config import Sampling
from treesearch.common.errors import ParseError
from treesearch.core.problem import Child, Problem
from treesearch.tasks.arith import evaluate, fmt, parse_number

PROPOSE_PROMPT = """Reach the target by combining two of the numbers with +, -, * or / into a new number. List possible moves, one per line, as "a op b = c (left: remaining numbers)".
Target: 21. Numbers: 3 4 5 9
Moves:
3 + 4 = 7 (left: 5 7 9)
9 - 5 = 4 (left: 3 4 4)
3 * 5 = 15 (left: 4 9 15)
9 / 3 = 3 (left: 3 4 5)
4 + 5 = 9 (left: 3 9 9)
Target: {target}. Numbers: {numbers}
Moves:
"""  # noqa: E501  (prompt text: the model sees these lines as they are)

VALUE_PROMPT = """Can the numbers reach the target with + - * / (each number used once)? Judge sure, likely or impossible.
Target: 10. Numbers: 2 5
Judgement: sure
Target: 7. Numbers: 1 1
Judgement: impossible
Target: 20. Numbers: 4 4 6
Judgement: likely
Target: 9. Numbers: 3 6
Judgement: sure
Target: 50. Numbers: 1 2 3
Judgement: impossible
Target: 12. Numbers: 2 3 6
Judgement: likely
Target: {target}. Numbers: {numbers}
Judgement:"""  # noqa: E501  (prompt text: the model sees these lines as they are)

COT_PROMPT = """Reach the target from the input numbers with + - * /, using each number exactly once. Work one step at a time: each step combines two of the numbers left into a new one. Then write the whole calculation as one expression.
Target: 14. Input: 2 4 5
Steps:
2 * 5 = 10 (left: 4 10)
10 + 4 = 14 (left: 14)
Answer: (2 * 5) + 4 = 14
Target: 9. Input: 3 6 12
Steps:
12 - 6 = 6 (left: 3 6)
6 + 3 = 9 (left: 9)
Answer: (12 - 6) + 3 = 9
Target: 30. Input: 1 2 5 6
Steps:
5 * 6 = 30 (left: 1 2 30)
2 - 1 = 1 (left: 1 30)
30 * 1 = 30 (left: 30)
Answer: (5 * 6) * (2 - 1) = 30
Target: {target}. Input: {numbers}
Steps:
"""  # noqa: E501  (prompt text: the model sees these lines as they are)

LABELS = {" sure": 20.0, " likely": 1.0, " impossible": 0.001}
MAX_NUMBERS = 6
_NUM = r"(\d+(?:\.\d+)?(?:/\d+)?)"
_MOVE = re.compile(rf"^\s*{_NUM}\s*([+\-*/×x÷])\s*{_NUM}\s*=\s*(-?\d+(?:\.\d+)?(?:/\d+)?)")
_COT_ANSWER = re.compile(r"^\s*Answer:(.*)$", re.MULTILINE)
_INPUT = re.compile(r"^\s*target\s*:\s*(\S+)\s*[;,]\s*numbers\s*:\s*(.+?)\s*$", re.IGNORECASE)
_INPUT_SWAPPED = re.compile(r"^\s*numbers\s*:\s*(.+?)\s*[;,]\s*target\s*:\s*(\S+)\s*$", re.IGNORECASE)
EXAMPLE = '"target: 10; numbers: 2 3 4"'


@dataclass(frozen=True)
class CountdownState:
    """The target, the puzzle's numbers, the numbers left (each with the expression that made it,
    sorted by value), the verified steps, and (chain of thought) the answer expression."""

    target: int
    puzzle: tuple[int, ...]
    numbers: tuple[tuple[Fraction, str], ...]
    steps: tuple[str, ...] = ()
    answer: str | None = None

    def values(self) -> tuple[Fraction, ...]:
        return tuple(v for v, _ in self.numbers)

    def numbers_text(self) -> str:
        return " ".join(fmt(v) for v in self.values())


def parse_input(x: Any) -> tuple[int, tuple[int, ...]]:
    """(target, numbers) of an input: "target: 10; numbers: 2 3 4" (either order) or a mapping
    {"target": 10, "numbers": [2, 3, 4]}; ParseError naming the expected form otherwise."""
    if isinstance(x, dict):
        target, numbers = x.get("target"), x.get("numbers")
        if isinstance(numbers, (list, tuple)):
            numbers = " ".join(str(v) for v in numbers)
        target = str(target) if target is not None else None
    elif isinstance(x, str):
        m = _INPUT.match(x)
        if m is not None:
            target, numbers = m.group(1), m.group(2)
        elif (m := _INPUT_SWAPPED.match(x)) is not None:
            numbers, target = m.group(1), m.group(2)
        else:
            target = numbers = None
    else:
        target = numbers = None
    if not isinstance(target, str) or not isinstance(numbers, str):
        raise ParseError(
            f"a Countdown input is {EXAMPLE} (a target and 2 to {MAX_NUMBERS} numbers), got {x!r:.60}"
        )
    parts = numbers.replace(",", " ").split()
    if not _whole(target):
        raise ParseError(f"the Countdown target must be a whole number such as 10, got {target!r:.20}")
    if not 2 <= len(parts) <= MAX_NUMBERS or not all(_whole(p) for p in parts):
        raise ParseError(
            f"Countdown numbers are 2 to {MAX_NUMBERS} whole numbers such as 2 3 4, got {numbers!r:.40}"
        )
    return int(target), tuple(int(p) for p in parts)


def _whole(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 6


def apply_step(state: CountdownState, line: str) -> tuple[str, CountdownState] | None:
    """The state after the move "a op b = c" written on `line`, if it is right: a and b are numbers
    still available (two different ones) and c is exactly a op b. None otherwise (the move is
    dropped: wrong arithmetic or numbers the state does not have are never corrected)."""
    m = _MOVE.match(line)
    if m is None:
        return None
    try:
        a, b, claimed = parse_number(m.group(1)), parse_number(m.group(3)), parse_number(m.group(4))
    except ParseError:
        return None
    op = {"×": "*", "x": "*", "÷": "/"}.get(m.group(2), m.group(2))
    pool = list(state.numbers)
    used = []
    for want in (a, b):
        at = next((i for i, (v, _) in enumerate(pool) if v == want), None)
        if at is None:
            return None
        used.append(pool.pop(at))
    if op == "/" and b == 0:
        return None
    result = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else a}[op]
    if result != claimed:
        return None
    expr = f"{_wrap(used[0][1])} {op} {_wrap(used[1][1])}"
    left = tuple(sorted(pool + [(result, expr)], key=lambda p: (p[0], p[1])))
    thought = f"{fmt(a)} {op} {fmt(b)} = {fmt(result)} (left: {' '.join(fmt(v) for v, _ in left)})"
    return thought, CountdownState(state.target, state.puzzle, left, state.steps + (thought,))


def _wrap(expr: str) -> str:
    return expr if _is_atom(expr) else f"({expr})"


def _is_atom(expr: str) -> bool:
    return expr.isdigit()


def answer_rejection(expression: str, puzzle: tuple[int, ...], target: int) -> str | None:
    """Why the expression does not reach the target from the puzzle's numbers, in one line; None
    when it does (parses, uses each puzzle number once and only those, equals the target)."""
    lhs = expression.split("=")[0]
    try:
        ev = evaluate(lhs)
    except ParseError as exc:
        return f"cannot evaluate {lhs.strip()!r:.80} ({exc})"
    have, used = Counter(Fraction(n) for n in puzzle), Counter(ev.numbers)
    foreign = sorted(x for x in used if x not in have)
    if foreign:
        return f"uses {', '.join(fmt(x) for x in foreign)}, which the puzzle does not have"
    repeated = sorted(x for x in used if used[x] > have[x])
    if repeated:
        return f"uses {', '.join(fmt(x) for x in repeated)} more often than the puzzle has it"
    missing = sorted((have - used).elements())
    if missing:
        return f"does not use {', '.join(fmt(x) for x in missing)} (each number is used once)"
    if ev.value != target:
        return f"equals {fmt(ev.value)}, not {target}"
    return None


def load_instances(size: int | None = None) -> list[dict]:
    """The shipped instances (data/countdown/countdown.jsonl: 200 of 3 numbers, then 200 of 4,
    then 200 of 5), or those of one size; each {"target", "numbers", "solution"}."""
    text = resources.files("treesearch.tasks").joinpath("data/countdown/countdown.jsonl").read_text()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [r for r in rows if size is None or len(r["numbers"]) == size]


class Countdown(Problem):
    """Countdown with the Game of 24 ToT protocol: verified moves proposed by the model, LM values."""

    name = "countdown"
    labels = LABELS
    value_range = (0.0, 20.0)
    max_depth = MAX_NUMBERS - 1  # one move per number beyond the first; a search stops at one number

    def __init__(
        self,
        *,
        propose_prompt: str = PROPOSE_PROMPT,
        value_prompt: str = VALUE_PROMPT,
        cot_prompt: str = COT_PROMPT,
        samples_per_expand: int = 3,
        temperature: float = 0.7,
        max_new_tokens: int = 80,
        cot_max_new_tokens: int = 160,
    ) -> None:
        self.propose_template = propose_prompt
        self.value_template = value_prompt
        self.cot_template = cot_prompt
        self.samples_per_expand = samples_per_expand
        self.sampling = Sampling(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=0.95 if temperature > 0 else 1.0,
            stop=("\nTarget:", "\n\n"),
        )
        self.cot_sampling = Sampling(max_new_tokens=cot_max_new_tokens, stop=("\nTarget:", "\n\n"))

    def check_input(self, x: Any) -> None:
        parse_input(x)

    def initial_state(self, x: Any) -> CountdownState:
        target, puzzle = parse_input(x)
        numbers = tuple(sorted((Fraction(v), str(v)) for v in puzzle))
        return CountdownState(target=target, puzzle=puzzle, numbers=numbers)

    def expand_prompt(self, state: CountdownState) -> str:
        return self.propose_template.format(target=state.target, numbers=state.numbers_text())

    def parse_children(self, state: CountdownState, text: str) -> list[Child]:
        """One child per right move line (`apply_step`), with the character span of its line."""
        children = []
        pos = 0
        for raw in text.splitlines(keepends=True):
            line = raw.splitlines()[0]
            step = apply_step(state, line)
            if step is not None:
                thought, child = step
                start = pos + len(line) - len(line.lstrip())
                children.append(Child(thought=thought, state=child, span=(start, pos + len(line.rstrip()))))
            pos += len(raw)
        return children

    def value_prompt(self, state: CountdownState) -> str:
        return self.value_template.format(target=state.target, numbers=state.numbers_text())

    def value(self, state: CountdownState) -> float | None:
        if self.is_terminal(state):
            return 20.0 if self.is_solved(state) else 0.001
        return None

    def is_terminal(self, state: CountdownState) -> bool:
        return state.answer is not None or len(state.numbers) == 1

    def is_solved(self, state: CountdownState) -> bool:
        expr = self._expression(state)
        return expr is not None and answer_rejection(expr, state.puzzle, state.target) is None

    def answer(self, state: CountdownState) -> str | None:
        """The expression and the value it really has (never the target it was meant to reach)."""
        expr = self._expression(state)
        if expr is None:
            return None
        if state.answer is None:  # the last number left, made by the verified steps
            return f"{expr} = {fmt(state.numbers[0][0])}"
        try:
            return f"{expr} = {fmt(evaluate(expr).value)}"
        except ParseError:
            return expr

    def _expression(self, state: CountdownState) -> str | None:
        if state.answer is not None:
            return state.answer
        if len(state.numbers) == 1 and state.steps:
            return state.numbers[0][1]
        return None

    def rejection_reason(self, state: CountdownState) -> str | None:
        expr = self._expression(state)
        return None if expr is None else answer_rejection(expr, state.puzzle, state.target)

    def cot_prompt(self, state: CountdownState) -> str:
        return self.cot_template.format(target=state.target, numbers=" ".join(map(str, state.puzzle)))

    def parse_cot(self, state: CountdownState, text: str) -> CountdownState:
        """The state of the chain of thought's first "Answer:" line (its expression, checked by
        `is_solved`); the root state when there is none or it says "no"."""
        m = _COT_ANSWER.search(text)
        expr = m.group(1).split("=")[0].strip() if m else ""
        if not expr or expr.lower().startswith("no"):
            return state
        return CountdownState(state.target, state.puzzle, state.numbers, answer=expr)

    def score_legend(self) -> str:
        return (
            "score: value in [0, 20], the model's judgement of the numbers left (sure=20, likely=1, "
            "impossible=0.001); one number left: 20 if it is the target, 0.001 if not"
        )

    def state_key(self, state: CountdownState) -> str:
        return f"{state.numbers_text()}|{state.answer}"

    def state_to_json(self, state: CountdownState) -> dict:
        return {
            "target": state.target,
            "puzzle": list(state.puzzle),
            "numbers": [[fmt(v), e] for v, e in state.numbers],
            "steps": list(state.steps),
            "answer": state.answer,
        }

    def state_from_json(self, data: dict) -> CountdownState:
        return CountdownState(
            target=int(data["target"]),
            puzzle=tuple(data["puzzle"]),
            numbers=tuple((parse_number(v), e) for v, e in data["numbers"]),
            steps=tuple(data["steps"]),
            answer=data["answer"],
        )
