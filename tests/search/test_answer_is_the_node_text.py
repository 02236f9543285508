"""The answer a user reads is the one on the tree: for every built-in task with a search Problem
(and its chain-of-thought view), and for the quickstart notebook's search, the answer the summary
prints (`treesearch solve`'s lines), the saved file and the SearchResult hold is the text the node
it names states, never rewritten (a Game of 24 line "... = 34" once printed as "... = 24").

Real searches with the default model, each kept small."""

from __future__ import annotations

import re

import pytest

import strategies
from treesearch import Sampling, Searcher, SearchResult
from treesearch.cli.main import answer_lines
from treesearch.tasks import GSM8K, TASKS, Countdown, Game24
from treesearch.tasks.arith import evaluate, fmt

LINE = re.compile(
    r"(?:answer: |no solution found; best attempt: )(?P<answer>.*) \(node #(?P<node>\d+), "
    r"(?:value \d+\.\d\d|not valued)\)"
)


def quickstart():
    """notebooks/01_quickstart.ipynb's search, as the notebook builds it."""
    problem = Game24(max_new_tokens=32)
    problem.samples_per_expand = 2
    sampling = Sampling(max_new_tokens=32, temperature=0.7, stop=problem.sampling.stop)
    return problem, strategies.BFS(breadth=2), {"sampling": sampling, "seed": 0}, "4 5 6 10"


def gsm8k_search():
    problem = GSM8K(samples_per_expand=1, max_steps=3, max_new_tokens=32)
    return (
        problem,
        strategies.BFS(breadth=1),
        {},
        "Tom has 3 apples and buys 4 more. How many apples does he have?",
    )


CASES = {
    "quickstart": quickstart,
    "game24-cot": lambda: (Game24(cot_max_new_tokens=96), strategies.CoT(), {}, "4 5 6 10"),
    "gsm8k": gsm8k_search,
    "countdown-cot": lambda: (
        Countdown(cot_max_new_tokens=64),
        strategies.CoT(),
        {},
        "target: 23; numbers: 4 8 11",
    ),
    "gsm8k-cot": lambda: (
        GSM8K(cot_max_new_tokens=64),
        strategies.CoT(),
        {},
        "Ann has 2 bags of 5 pears. How many pears?",
    ),
}


def test_every_task_with_a_search_problem_is_covered():
    assert {name.split("-")[0] for name in CASES} - {"quickstart"} == set(TASKS)


@pytest.mark.real_model
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_printed_saved_and_returned_answer_is_the_text_of_the_node_it_names(real_lm, tmp_path, case):
    problem, strategy, kw, x = CASES[case]()
    result = Searcher(real_lm, problem, strategy, progress=False, **kw).solve(x)
    assert result.answer_node is not None, result.tree.text_view()  # the search states an answer
    printed = LINE.fullmatch(answer_lines(result)[0])
    assert printed is not None, answer_lines(result)
    answer, node = printed["answer"], int(printed["node"])
    thought = result.tree.node(node)["thought"]
    assert node == result.answer_node and answer == result.answer
    if problem.name == "game24" and not isinstance(strategy, strategies.CoT):
        assert thought == f"Answer: {answer}"  # the answer step's line, exactly
    elif problem.name == "countdown":  # the expression as the thought writes it, and its true value
        expr, value = answer.rsplit(" = ", 1)
        assert f"Answer: {expr} =" in thought and value == fmt(evaluate(expr).value)
    else:
        assert answer in thought  # the number (gsm8k) or answer line (CoT) as the thought writes it
    saved = SearchResult.load(result.save(tmp_path / "r.json"), problem)
    assert (saved.answer, saved.answer_node) == (answer, node)
    assert result.to_json(problem)["answer"] == answer
