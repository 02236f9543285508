"""`Problem.check_input` guards every Searcher entry point: `solve`, `solve_many` (per input, as an
"invalid" result, like the CLI run's rows) and `resume` refuse a bad input with the problem's own
ParseError, before any model work, instead of failing later inside `initial_state`."""

from __future__ import annotations

import threading

import pytest

from strategies import BFS
from treesearch import ParseError, RKSCConfig, Searcher
from treesearch.common.config import Sampling
from treesearch.core.problem import Child, Problem
from treesearch.engine.local import Engine

MESSAGE = "a count input is a whole number such as \"3\", got 'oops'"


class Count(Problem):
    """Input: a whole number (text "3", an int, or a 1-tuple of one); initial_state would fail on
    anything else with an unrelated ValueError."""

    name = "count"
    max_depth = 2
    value_range = (0.0, 1.0)
    sampling = Sampling(max_new_tokens=3)

    def __init__(self) -> None:
        self.checked: list = []
        self.started: list = []

    def check_input(self, x) -> None:
        self.checked.append(x)
        n = x[0] if isinstance(x, tuple) and len(x) == 1 else x
        if isinstance(n, int) and not isinstance(n, bool):
            return
        if isinstance(n, str) and n.strip().isdigit():
            return
        raise ParseError(f'a count input is a whole number such as "3", got {x!r:.40}')

    def initial_state(self, x) -> tuple:
        self.started.append(x)
        return (int(x[0] if isinstance(x, tuple) else x),)  # int("oops"): "invalid literal for int()"

    def expand_prompt(self, state: tuple) -> str:
        return f"Count up from {state[0]}:" + "".join(f" {w}" for w in state[1:])

    def parse_children(self, state: tuple, text: str) -> list[Child]:
        word = (text.split() or ["#"])[0][:16]
        return [Child(thought=word, state=state + (word,))]

    def value(self, state: tuple) -> float:
        return 0.5


def make(lm, problem):
    return Searcher(lm, problem, BFS(breadth=1), RKSCConfig(), progress=False)


def many(searcher, inputs, concurrency=2, timeout=120):
    """list(searcher.solve_many(inputs)), failing instead of hanging if it never ends."""
    out: dict = {}

    def main():
        try:
            out["results"] = list(searcher.solve_many(inputs, concurrency=concurrency))
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=main, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"solve_many did not finish in {timeout} s"
    if "error" in out:
        raise out["error"]
    return out["results"]


@pytest.fixture
def generations(monkeypatch):
    """The prompts every local engine generated from, in this test."""
    calls: list = []
    generate = Engine.generate

    def spy(self, prompts, *a, **kw):
        calls.append(list(prompts))
        return generate(self, prompts, *a, **kw)

    monkeypatch.setattr(Engine, "generate", spy)
    return calls


def test_solve_refuses_a_bad_input_with_the_problems_parse_error_before_any_model_work(tiny_lm, generations):
    problem = Count()
    searcher = make(tiny_lm, problem)
    with pytest.raises(ParseError) as info:
        searcher.solve("oops")
    assert str(info.value) == MESSAGE
    assert problem.started == []  # initial_state never ran
    assert searcher.engine is None and generations == []  # no engine built, no generation
    assert len(searcher.tree) == 0 and searcher.partial_result is None


def test_solve_checks_a_good_input_once_and_searches(tiny_lm):
    problem = Count()
    result = make(tiny_lm, problem).solve("3")
    assert problem.checked == ["3"] and problem.started == ["3"]
    assert result.status == "complete" and len(result.tree) > 1


def test_solve_many_reports_a_refused_input_as_invalid_and_solves_the_others(tiny_lm):
    problem = Count()
    inputs = ["3", "oops", "5"]
    results = many(make(tiny_lm, problem), inputs)
    assert [r.status for r in results] == ["complete", "invalid", "complete"]
    bad = results[1]
    assert bad.error == f"ParseError: {MESSAGE}"
    assert len(bad.tree) == 0 and bad.answer is None and not bad.solved
    assert bad.stats.get("model_calls", 0) == 0
    assert [r.tree.meta["input"] for r in results] == inputs  # input order, the refused one included
    assert sorted(problem.checked) == sorted(inputs)  # each input checked once
    assert "oops" not in problem.started
    alone = [make(tiny_lm, Count()).solve(x) for x in ("3", "5")]
    assert [r.answer for r in alone] == [results[0].answer, results[2].answer]
    assert [len(r.tree) for r in alone] == [len(results[0].tree), len(results[2].tree)]


class Broken(Count):
    """Accepts every input, then fails in initial_state on one (a bug in the Problem)."""

    def check_input(self, x) -> None:
        self.checked.append(x)


def test_solve_many_reports_an_input_that_fails_before_its_search_began_as_failed(tiny_lm):
    results = many(make(tiny_lm, Broken()), ["3", "oops"])
    assert [r.status for r in results] == ["complete", "failed"]
    assert results[1].error.startswith("ValueError: invalid literal for int()")


def test_resume_refuses_a_saved_search_whose_input_the_problem_refuses(tiny_lm, generations):
    part = make(tiny_lm, Count()).solve("3")
    part.tree.meta["input"] = "oops"  # e.g. a hand-edited or foreign save file
    problem = Count()
    searcher = make(tiny_lm, problem)
    calls = len(generations)
    with pytest.raises(ParseError) as info:
        searcher.resume(part)
    assert str(info.value) == MESSAGE
    assert searcher.engine is None and len(generations) == calls
    assert len(searcher.tree) == 0


def test_resume_of_a_good_search_still_works_for_non_text_inputs(tiny_lm):
    """The saved input is its text (str(x)); a non-text input is not re-checked from that text."""
    first = make(tiny_lm, Count()).solve((3,))
    problem = Count()
    again = make(tiny_lm, problem).resume(first)
    assert again.status == "complete" and len(again.tree) == len(first.tree)
    text = make(tiny_lm, Count()).solve("4")
    problem = Count()
    make(tiny_lm, problem).resume(text)
    assert problem.checked == ["4"]
