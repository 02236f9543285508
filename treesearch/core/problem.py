"""`Problem`: the user's reasoning task. It turns states into prompts and model text into child
states; it never touches the model.

Contract (each method is called by the `Searcher`, never by strategies directly):
- `check_input(x)`: raise ParseError when x is not a valid input (no model needed; default: accept).
- `initial_state(x)`: the root state for input x (default: x itself).
- `expand_prompt(state) -> str`: the prompt whose continuation proposes children.
  Chain style: return the parent's context plus the new thought (e.g. `state.text`); the engine
  then reuses the parent's K/V, generated tokens included. Template style: re-render a few-shot
  prompt from the state; the shared template is found by the exact prefix index.
- `parse_children(state, text) -> list[Child]`: children from one generation (may be empty; the
  text is data, never executed). A `(thought, state)` tuple is accepted for a Child.
- Value, one of: `value(state) -> float | None` (programmatic, wins when not None) or
  `value_prompt(state) -> str` with `labels` {label text: weight}; the LM value is the expected
  weight under the labels' probabilities after the prompt (each its whole token sequence's,
  renormalised over the labels; `treesearch.engine.labels`).
- `is_terminal(state)`, `is_solved(state)`, `answer(state)`; optional `rejection_reason(state)`:
  why a state's answer is not a solution, in one line (`SearchResult.rejection`; default None).
- `graded_by_reference`: True when `is_solved` compares the answer with a reference answer the
  search must not see (a test set's gold answer, as GSM8K's), rather than checking it by itself
  (as Game of 24's arithmetic check does). The search then never chooses by it: no node is marked
  solved while searching, and the answer comes from the strategy's choice and the values alone;
  `is_solved` only grades the answer found (`SearchResult.solved`). Default False.
- `score_legend()`: what a node's score means, for the tree views' legends (default: from
  `value_range` and `labels`).
- `value_range`: (low, high) that every value must fall in; NaN or out-of-range values raise.
- Chain of thought (optional, for the one-shot baseline `strategies.CoT`): `cot_prompt(state)`,
  a prompt whose one continuation reasons to an answer; `parse_cot(state, text)`, the state that
  continuation's answer gives; `cot_sampling`, how that continuation is generated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from treesearch.common.config import Sampling
from treesearch.common.errors import ProblemDefinitionError
from treesearch.core.state_json import NotJSON, decode, encode


@dataclass
class Child:
    """One proposed child: the thought text shown in the tree and the state it leads to."""

    thought: str
    state: Any
    prior: float | None = None  # optional prior for PUCT-style strategies
    # optional character range [start, end) of the generation text the child was parsed from: its
    # confidence (CGEE Level 1) is then that of the tokens that wrote it, not the whole generation's
    span: tuple[int, int] | None = None


class Problem:
    """Base class for reasoning problems. Subclass and override the methods named in the module doc."""

    name: str = "problem"
    labels: Mapping[str, float] | None = None
    value_range: tuple[float, float] = (-math.inf, math.inf)
    max_depth: int = 4
    samples_per_expand: int = 1
    graded_by_reference: bool = False  # is_solved reads a reference answer: a grade, not a check
    sampling: Sampling = Sampling(max_new_tokens=128, stop=("\n\n",))

    # -- required --------------------------------------------------------------------------------
    def expand_prompt(self, state: Any) -> str:
        raise NotImplementedError

    def parse_children(self, state: Any, text: str) -> list[Child]:
        raise NotImplementedError

    # -- optional --------------------------------------------------------------------------------
    def check_input(self, x: Any) -> None:
        """Raise `treesearch.ParseError` naming the expected form when x is not an input this problem
        can start from. Needs no model: the CLI calls it before loading one, so a typo costs no
        start-up time. The default accepts anything."""
        return None

    def initial_state(self, x: Any) -> Any:
        return x

    def value_prompt(self, state: Any) -> str | None:
        return None

    def value(self, state: Any) -> float | None:
        return None

    def is_terminal(self, state: Any) -> bool:
        return False

    def is_solved(self, state: Any) -> bool:
        return False

    def answer(self, state: Any) -> str | None:
        return None

    def rejection_reason(self, state: Any) -> str | None:
        """Why the answer this state states is not a solution, one line for the user (Game of 24:
        "uses 12 and 9, which the puzzle does not have"); None when it is one, or when the problem
        gives no reason (the default)."""
        return None

    cot_sampling: Sampling = Sampling(max_new_tokens=256, stop=("\n\n",))

    def cot_prompt(self, state: Any) -> str | None:
        """A chain-of-thought prompt for `state`: one generation after it works through the task
        and states the answer (`strategies.CoT`); None (the default) when the problem has none."""
        return None

    def parse_cot(self, state: Any, text: str) -> Any:
        """The state that the chain of thought `text` (generated after `cot_prompt(state)`) ends
        in: the answer it states, read by the task's own parser (the text is data, never run)."""
        raise NotImplementedError

    def score_legend(self) -> str:
        """What a node's score is, one line for the tree views' legends. The default reads
        `value_range` and `labels`; override it to say more (what the value estimates)."""
        lo, hi = self.value_range
        span = f" in [{lo:g}, {hi:g}]" if math.isfinite(lo) and math.isfinite(hi) else ""
        if self.labels and type(self).value_prompt is not Problem.value_prompt:
            weights = ", ".join(f"{k.strip() or repr(k)}={w:g}" for k, w in self.labels.items())
            return f"score: value estimate{span}, the expected weight of the model's label ({weights})"
        return f"score: {type(self).__name__}.value(state){span}"

    def state_key(self, state: Any) -> str:
        """A string identifying the state (siblings with equal keys are merged)."""
        return repr(state)

    def state_to_json(self, state: Any) -> Any:
        """A JSON-able form of the state for saving the tree (`save`, resume). The default keeps
        JSON's types as they are and writes tuples, sets, frozensets and dicts with non-str keys
        as tagged objects ({"__tuple__": [...]}, `treesearch.core.state_json`), which the default
        `state_from_json` reads back as what they were. A state of another type (a dataclass, a
        custom class) raises ProblemDefinitionError: override this with `state_from_json`, so that
        `state_from_json(state_to_json(s)) == s` (`SearchResult.save` checks it)."""
        try:
            return encode(state)
        except NotJSON as exc:
            cls = type(self).__name__
            raise ProblemDefinitionError(
                f"{cls}: a state of type {type(state).__name__} cannot be saved as JSON ({exc}); define "
                f"{cls}.state_to_json(state) returning JSON data (dict, list, str, numbers) and "
                f"{cls}.state_from_json(data) rebuilding the state"
            ) from None

    def state_from_json(self, data: Any) -> Any:
        """The state `state_to_json` saved as `data` (the default reads its tags back)."""
        return decode(data)


def check_problem(problem: Problem) -> None:
    """Fail early, naming the class and method, when a Problem cannot work at all."""
    cls = type(problem).__name__
    for meth in ("expand_prompt", "parse_children"):
        if getattr(type(problem), meth) is getattr(Problem, meth):
            raise ProblemDefinitionError(f"{cls} must define {meth}(); see treesearch.Problem's docstring")
    has_value = type(problem).value is not Problem.value
    has_prompt = type(problem).value_prompt is not Problem.value_prompt
    if not (has_value or has_prompt):
        raise ProblemDefinitionError(f"{cls} must define value(state) or value_prompt(state) with labels")
    if has_prompt and not problem.labels:
        raise ProblemDefinitionError(
            f"{cls}.value_prompt needs {cls}.labels, e.g. {{' sure': 20, ' likely': 1, ' impossible': 0.001}}"
        )
    lo, hi = _check_range(problem)
    if problem.labels is not None:
        if not isinstance(problem.labels, Mapping) or not problem.labels:
            raise ProblemDefinitionError(
                f"{cls}.labels must be a non-empty dict of label text -> weight, got {problem.labels!r:.60}"
            )
        for k, w in problem.labels.items():
            if (
                not isinstance(k, str)
                or not k
                or isinstance(w, bool)
                or not isinstance(w, (int, float))
                or math.isnan(w)
            ):
                raise ProblemDefinitionError(
                    f"{cls}.labels must map label text to a number, got {k!r}: {w!r}"
                )
            if not lo <= w <= hi:
                raise ProblemDefinitionError(
                    f"{cls}.labels weight {w!r} of {k!r} is outside {cls}.value_range "
                    f"{problem.value_range}; an LM "
                    "value is a weighted mean of the label weights, so every weight must lie in value_range"
                )
    spe = problem.samples_per_expand
    if isinstance(spe, bool) or not isinstance(spe, int) or spe < 1:
        raise ProblemDefinitionError(f"{cls}.samples_per_expand={spe!r}; it must be an int of at least 1")
    d = problem.max_depth
    if isinstance(d, bool) or not isinstance(d, int) or d < 0:
        raise ProblemDefinitionError(f"{cls}.max_depth={d!r}; it must be an int of at least 0")
    if not isinstance(problem.sampling, Sampling):
        raise ProblemDefinitionError(
            f"{cls}.sampling is {type(problem.sampling).__name__}; it must be a "
            "treesearch.Sampling, e.g. Sampling(max_new_tokens=64, stop=('\\n\\n',))"
        )


def _check_range(problem: Problem) -> tuple[float, float]:
    cls = type(problem).__name__
    r = problem.value_range
    ok = (
        isinstance(r, (tuple, list))
        and len(r) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v) for v in r)
    )
    if not ok or r[0] > r[1]:
        raise ProblemDefinitionError(
            f"{cls}.value_range={r!r:.60}; it must be a (low, high) pair of numbers with "
            "low <= high, e.g. (0.0, 1.0)"
        )
    return float(r[0]), float(r[1])


def check_prompt(problem: Problem, method: str, prompt: Any) -> str:
    if not isinstance(prompt, str):
        raise ProblemDefinitionError(
            f"{type(problem).__name__}.{method}() returned {type(prompt).__name__}; it must return a str "
            "prompt"
        )
    if not prompt:
        raise ProblemDefinitionError(
            f"{type(problem).__name__}.{method}() returned an empty prompt; it must return a non-empty str"
        )
    return prompt


def check_children(problem: Problem, children: Any) -> list[Child]:
    cls = type(problem).__name__
    if children is None:
        raise ProblemDefinitionError(
            f"{cls}.parse_children() returned None; return a list (empty if nothing parsed)"
        )
    if not isinstance(children, (list, tuple)):
        raise ProblemDefinitionError(
            f"{cls}.parse_children() returned {type(children).__name__}; return a list of Child"
        )
    out = []
    for c in children:
        if isinstance(c, Child):
            out.append(c)
        elif isinstance(c, tuple) and len(c) == 2 and isinstance(c[0], str):
            out.append(Child(thought=c[0], state=c[1]))
        else:
            raise ProblemDefinitionError(
                f"{cls}.parse_children() returned an item {c!r:.80}; each item must be Child(thought, state) "
                "or a (thought: str, state) tuple"
            )
        if not isinstance(out[-1].thought, str):
            raise ProblemDefinitionError(
                f"{cls}.parse_children() returned a child whose thought is "
                f"{type(out[-1].thought).__name__}; a child's thought must be a str"
            )
        prior = out[-1].prior
        if prior is not None and (
            isinstance(prior, bool)
            or not isinstance(prior, (int, float))
            or not math.isfinite(prior)
            or prior < 0
        ):
            raise ProblemDefinitionError(
                f"{cls}.parse_children() returned a child with prior {prior!r}; a prior "
                "must be a finite number >= 0 or None"
            )
    return out


def check_text(problem: Problem, method: str, text: Any, *, none: bool = False) -> str | None:
    """A one-line text a Problem method returned for the user (a legend, a rejection reason); None
    only where the method may return it."""
    if text is None and none:
        return None
    if not isinstance(text, str):
        allowed = "a str or None" if none else "a str"
        raise ProblemDefinitionError(
            f"{type(problem).__name__}.{method}() returned {type(text).__name__}; it must return {allowed}"
        )
    return " ".join(text.split())


def check_value(problem: Problem, value: Any, state: Any) -> float:
    cls = type(problem).__name__
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProblemDefinitionError(f"{cls}.value() returned {value!r}; it must return a float or None")
    v = float(value)
    lo, hi = problem.value_range
    if math.isnan(v):
        raise ProblemDefinitionError(
            f"{cls}.value() gave NaN for state {state!r:.60}; it must return a number "
            f"within {cls}.value_range {problem.value_range} or None"
        )
    if not lo <= v <= hi:
        raise ProblemDefinitionError(
            f"{cls}.value() gave {v} for state {state!r:.60}, outside {cls}.value_range "
            f"{problem.value_range}; return a value in that range or widen value_range"
        )
    return v
