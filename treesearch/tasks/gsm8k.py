"""GSM8K as a chain-style problem: each thought is one reasoning step, and a child's context is
its parent's context plus that step, so the engine reuses the parent's K/V (generated tokens
included) and computes only the new step.

- expand: the prompt is the worked example + question + the steps so far; the model writes the
  next line (sampled, `samples_per_expand` children per node).
- value: the same context followed by a yes/no question about the last step, scored at the next
  token (labels " yes" / " no" weighted 1 / 0), so the value pass also reuses the context's K/V.
- chain of thought (`strategies.CoT`): one worked example, then one greedy generation that
  reasons step by step to "The answer is N".
- a step containing "The answer is N" ends the branch; `extract_number` reads N without evaluating
  anything (a regular expression over the text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from treesearch.common.config import Sampling
from treesearch.common.errors import ParseError
from treesearch.core.problem import Child, Problem

PROMPT = """Solve the math word problem step by step. Write one step per line and finish with "The answer is N."
Question: A baker makes 12 muffins in each batch. She bakes 3 batches and sells 20 muffins. How many muffins are left?
Step: She bakes 12 * 3 = 36 muffins.
Step: After selling, 36 - 20 = 16 muffins are left.
Step: The answer is 16.
Question: {question}
"""  # noqa: E501  (prompt text: the model sees these lines as they are)
COT_PROMPT = """Solve the math word problem. Think step by step, then finish with "The answer is N."
Question: A library has 4 shelves with 25 books each. It lends out 30 books and gets 12 back. How many books are on the shelves?
Answer: The shelves hold 4 * 25 = 100 books. After lending 30, 100 - 30 = 70 are left. With 12 returned, 70 + 12 = 82. The answer is 82.
Question: {question}
Answer:"""  # noqa: E501  (prompt text: the model sees these lines as they are)
STEP = "Step:"
VALUE_SUFFIX = "\nIs the last step correct? Reply yes or no.\nReply:"
LABELS = {" yes": 1.0, " no": 0.0}
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_ANSWER = re.compile(r"answer is\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)", re.IGNORECASE)


def extract_number(text: str) -> str | None:
    """The final answer in a text: the number after "answer is" (or "####"), else the last number.

    Normalised: commas removed, trailing ".0" dropped. None when the text holds no number."""
    raw = number_as_written(text)
    if raw is None:
        return None
    raw = raw.replace(",", "").rstrip(".")
    if "." in raw:
        raw = raw.rstrip("0").rstrip(".")
    return raw or None


def number_as_written(text: str) -> str | None:
    """The number `extract_number` reads, as the text writes it ("1,000" where it reads 1000)."""
    if not isinstance(text, str):
        return None
    text = text[:10_000]
    m = _ANSWER.search(text)
    if m is None and "####" in text:
        m = _NUMBER.search(text.split("####")[-1])
        return m.group(0) if m else None
    if m is not None:
        return m.group(1)
    found = _NUMBER.findall(text)
    return found[-1] if found else None


@dataclass(frozen=True)
class GSM8KState:
    question: str
    steps: tuple[str, ...] = ()
    answer: str | None = None
    gold: str | None = None


class GSM8K(Problem):
    """Chain-style GSM8K: one step per thought, yes/no value of the last step."""

    name = "gsm8k"
    labels = LABELS
    value_range = (0.0, 1.0)
    graded_by_reference = True  # is_solved compares with the test set's answer: it grades, never guides

    def __init__(
        self,
        *,
        prompt: str = PROMPT,
        samples_per_expand: int = 3,
        max_steps: int = 6,
        temperature: float = 0.7,
        max_new_tokens: int = 48,
        cot_prompt: str = COT_PROMPT,
        cot_max_new_tokens: int = 256,
    ) -> None:
        self.template = prompt
        self.cot_template = cot_prompt
        self.cot_sampling = Sampling(max_new_tokens=cot_max_new_tokens, stop=("\nQuestion:", "\n\n"))
        self.samples_per_expand = samples_per_expand
        self.max_depth = max_steps
        self.sampling = Sampling(
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=0.95, stop=("\n",)
        )

    def check_input(self, x: Any) -> None:
        """A question: non-empty text, or a dataset row {"question": ..., "answer": ...}; ParseError
        otherwise."""
        question = x.get("question") if isinstance(x, dict) else x
        if not isinstance(question, str) or not question.strip():
            raise ParseError(
                f'a GSM8K input is a word problem such as "Tom has 3 boxes of 4 apples and eats 2. '
                f'How many are left?", got {x!r:.60}'
            )

    def initial_state(self, x: Any) -> GSM8KState:
        if isinstance(x, dict):
            gold = extract_number(x.get("answer", "")) if x.get("answer") else None
            return GSM8KState(question=str(x["question"]).strip(), gold=gold)
        return GSM8KState(question=str(x).strip())

    def context(self, state: GSM8KState) -> str:
        """The text the model has seen for this state: prompt, question and steps so far."""
        text = self.template.format(question=state.question)
        for s in state.steps:
            text += f"{STEP} {s}\n"
        return text

    def expand_prompt(self, state: GSM8KState) -> str:
        return self.context(state) + STEP

    def parse_children(self, state: GSM8KState, text: str) -> list[Child]:
        step = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not step:
            return []
        answer = None
        if _ANSWER.search(step):
            answer = extract_number(step)
        return [
            Child(
                thought=step,
                state=GSM8KState(
                    question=state.question, steps=state.steps + (step,), answer=answer, gold=state.gold
                ),
            )
        ]

    def cot_prompt(self, state: GSM8KState) -> str:
        """One worked example, then the question: the model reasons step by step and ends with
        "The answer is N" (greedy, one generation: the chain-of-thought baseline)."""
        return self.cot_template.format(question=state.question)

    def parse_cot(self, state: GSM8KState, text: str) -> GSM8KState:
        """The chain of thought's lines as steps and its answer by `extract_number` (the number
        after "answer is", else the last number; None when the text has none)."""
        steps = tuple(line.strip() for line in text.strip().splitlines() if line.strip())
        return GSM8KState(question=state.question, steps=steps, answer=extract_number(text), gold=state.gold)

    def value_prompt(self, state: GSM8KState) -> str:
        return self.context(state).rstrip("\n") + VALUE_SUFFIX

    def is_terminal(self, state: GSM8KState) -> bool:
        return state.answer is not None or len(state.steps) >= self.max_depth

    def is_solved(self, state: GSM8KState) -> bool:
        return state.answer is not None and state.gold is not None and state.answer == state.gold

    def answer(self, state: GSM8KState) -> str | None:
        """The number the steps state as the answer, as written in the node's thought ("1,000"),
        never rewritten; the comparison with the reference uses its normalised form (1000)."""
        if state.answer is None:
            return None
        raw = number_as_written("\n".join(state.steps))
        return raw if raw is not None and extract_number(raw) == state.answer else state.answer

    def rejection_reason(self, state: GSM8KState) -> str | None:
        """Why the state's answer is not a solution: no reference answer to check it against, or
        a different number."""
        if state.answer is None or state.answer == state.gold:
            return None
        if state.gold is None:
            return 'no reference answer to check it against (give {"question": ..., "answer": ...})'
        return f"the answer is {state.answer}, the reference answer is {state.gold}"

    def state_key(self, state: GSM8KState) -> str:
        return "\n".join(state.steps)

    def state_to_json(self, state: GSM8KState) -> dict:
        return {
            "question": state.question,
            "steps": list(state.steps),
            "answer": state.answer,
            "gold": state.gold,
        }

    def state_from_json(self, data: dict) -> GSM8KState:
        return GSM8KState(
            question=data["question"],
            steps=tuple(data["steps"]),
            answer=data["answer"],
            gold=data.get("gold"),
        )
