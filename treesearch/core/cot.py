"""`ChainOfThought`: a task seen as a one-step problem, the Tree-of-Thoughts paper's chain-of-thought
baseline. The root's one expansion is the task's `cot_prompt`; its one generation becomes one child,
the state `parse_cot` reads from it (the answer it states), valued 1 if that answer solves the task,
else 0. Everything else (inputs, answers, checks, saved states) is the task's own, so a run's
accuracy, result lines and resume work as for a search. `strategies.CoT` runs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from treesearch.common.errors import ProblemDefinitionError
from treesearch.core.problem import Child, Problem


class ChainOfThought(Problem):
    """The one-generation view of `task`: expand the root once with `task.cot_prompt`, no search."""

    labels: Mapping[str, float] | None = None
    value_range = (0.0, 1.0)
    max_depth = 1
    samples_per_expand = 1

    def __init__(self, task: Problem) -> None:
        cls = type(task).__name__
        if type(task).cot_prompt is Problem.cot_prompt or type(task).parse_cot is Problem.parse_cot:
            raise ProblemDefinitionError(
                f"{cls} has no chain-of-thought prompt; define {cls}.cot_prompt(state) and "
                f"{cls}.parse_cot(state, text) to run it with strategies.CoT (--strategy cot)"
            )
        self.task = task
        self.name = task.name
        self.graded_by_reference = task.graded_by_reference
        self.sampling = task.cot_sampling

    def check_input(self, x: Any) -> None:
        self.task.check_input(x)

    def initial_state(self, x: Any) -> Any:
        return self.task.initial_state(x)

    def expand_prompt(self, state: Any) -> str:
        prompt = self.task.cot_prompt(state)
        if prompt is None:
            cls = type(self.task).__name__
            raise ProblemDefinitionError(f"{cls}.cot_prompt() gave None for {state!r:.60}; return a prompt")
        return prompt

    def parse_children(self, state: Any, text: str) -> list[Child]:
        """One child whatever the text: the state its answer gives (no answer: the task says so)."""
        return [Child(thought=text.strip(), state=self.task.parse_cot(state, text))]

    def value(self, state: Any) -> float | None:
        return 1.0 if self.task.is_solved(state) else 0.0

    def is_terminal(self, state: Any) -> bool:
        return self.task.is_terminal(state)

    def is_solved(self, state: Any) -> bool:
        return self.task.is_solved(state)

    def answer(self, state: Any) -> str | None:
        return self.task.answer(state)

    def rejection_reason(self, state: Any) -> str | None:
        return self.task.rejection_reason(state)

    def score_legend(self) -> str:
        return "score: 1 if the chain of thought's answer solves the task, else 0"

    def state_key(self, state: Any) -> str:
        return self.task.state_key(state)

    def state_to_json(self, state: Any) -> Any:
        return self.task.state_to_json(state)

    def state_from_json(self, data: Any) -> Any:
        return self.task.state_from_json(data)


def chain_of_thought(task: Problem) -> ChainOfThought:
    """The chain-of-thought view of `task` (the same object when it already is one)."""
    return task if isinstance(task, ChainOfThought) else ChainOfThought(task)


def problem_for(strategy: Any, problem: Problem) -> Problem:
    """The problem `strategy` searches: its `problem_for(problem)` where it has one (`strategies.CoT`:
    the task's chain-of-thought view), else `problem` itself. The Searcher and the CLI apply it."""
    view = getattr(strategy, "problem_for", None)
    return view(problem) if callable(view) else problem
