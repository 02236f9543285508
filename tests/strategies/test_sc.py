"""Self-consistency (`strategies.SelfConsistency`): the majority of the chains' normalised answers,
ties broken by the chains' mean value, then by the first chain; values asked for only on a tie and
only of the tied chains. Hand-built chains with programmatic values, searched by the model-free
`TableSearcher` (its j-th generation is "sample j"), so every vote is known; then one real search."""

from __future__ import annotations

import pytest

from strategies import SelfConsistency
from strategies.sc import SampledChains, Vote, majority
from strategies.testing import TableSearcher
from treesearch import Problem
from treesearch.common.errors import ConfigError, ProblemDefinitionError
from treesearch.core.problem import Child
from treesearch.tasks.gsm8k import extract_number


class Chains(Problem):
    """Chain j's answer text is `answers[j]` (normalised by GSM8K's `extract_number`), its value
    `values[j]`; chains listed in `same` give one identical state (they merge into one child).
    Solved: the answer "12"."""

    name = "chains"
    value_range = (0.0, 1.0)

    def __init__(self, answers, values=None, same=()):
        self.answers, self.values, self.same = list(answers), list(values or [0.5] * len(answers)), set(same)

    def cot_prompt(self, state):
        return f"Question: {state}\nAnswer:"

    def parse_cot(self, state, text):
        j = int(text.split()[1])
        first = min(self.same) if j in self.same else j  # merged chains share the first one's state
        return {"chain": first, "text": self.answers[first]}

    def expand_prompt(self, state):
        return f"Search: {state}"

    def parse_children(self, state, text):
        return [Child(thought=text, state=state)]

    def value(self, state):
        return self.values[state["chain"]] if isinstance(state, dict) else 0.0

    def is_solved(self, state):
        return isinstance(state, dict) and self.answer(state) == "12"

    def is_terminal(self, state):
        return isinstance(state, dict)

    def answer(self, state):
        return extract_number(state["text"]) if isinstance(state, dict) else None

    def state_key(self, state):
        return repr(sorted(state.items())) if isinstance(state, dict) else repr(state)


def vote(answers, values=None, same=()):
    s = TableSearcher(Chains(answers, values, same), SelfConsistency(samples=len(answers)))
    return s, s.solve("q")


def chains_of(result, status):
    return [n for n in result.tree.children(0) if result.tree.node(n)["status"] == status]


def test_the_most_frequent_answer_wins_without_valuing_anything():
    s, r = vote(["7", "12", "The answer is 12.", "3", "12.0"])
    assert r.answer == "12" and r.solved
    assert s.ops("expand") == [[0]] and s.ops("evaluate") == []  # no tie: no value asked for
    assert chains_of(r, "solution") == [2, 3, 5] and chains_of(r, "pruned") == [1, 4]
    assert r.best == 2  # unvalued chains of the winner: the first


def test_answers_are_compared_after_the_tasks_normalisation():
    """ "1,200", "1200" and "1200.0" are one answer for GSM8K's extract_number: 3 votes beat 2."""
    _, r = vote(["1,200", "5", "1200", "5", "1200.0"])
    assert r.answer == "1200"


def test_a_tie_is_broken_by_the_mean_value_of_the_tied_chains_only():
    # 7: chains 1 and 3 (mean 0.3); 12: chains 2 and 4 (mean 0.5); 3: chain 5, one vote, never valued
    s, r = vote(["7", "12", "7", "12", "3"], values=[0.2, 0.9, 0.4, 0.1, 1.0])
    assert r.answer == "12"
    assert s.ops("evaluate") == [[1, 3, 2, 4]]  # the tied answers' chains, answer by answer
    assert r.tree.node(5)["score"] is None
    assert r.best == 2  # the winner's highest-valued chain


def test_a_tie_in_value_too_goes_to_the_answer_whose_first_chain_came_first():
    _, r = vote(["7", "12", "12", "7"], values=[0.5, 0.5, 0.5, 0.5])
    assert r.answer == "7" and not r.solved
    _, r = vote(["12", "7", "7", "12"], values=[0.5, 0.5, 0.5, 0.5])
    assert r.answer == "12"


def test_identical_chains_merge_into_one_child_that_counts_each_sample():
    """Chains 0, 1, 2 write the same state (one child holding 3 samples) against two different
    chains answering 12: 3 votes to 2, no tie, so nothing is valued."""
    s, r = vote(["7", "7", "7", "12", "12"], same=(0, 1, 2))
    tree = r.tree
    assert tree.children(0) == [1, 2, 3]
    assert [tree.node(n)["samples"] for n in (1, 2, 3)] == [3, 1, 1]
    assert r.answer == "7" and s.ops("evaluate") == []


def test_chains_without_an_answer_do_not_vote():
    _, r = vote(["no idea", "none", "12"])
    assert r.answer == "12"
    _, r = vote(["no idea", "none"])
    assert r.answer is None and r.best == 1 and not r.solved


def test_majority_rule_on_votes():
    v = [Vote("a", 2, 0.1, 4), Vote("b", 3, 0.0, 9), Vote("c", 3, 0.2, 7)]
    assert majority(v) == "c"  # 3 votes each for b and c: c's mean value is higher
    assert majority([Vote("a", 2, None, 1), Vote("b", 2, 0.0, 5)]) == "b"  # unvalued ranks lowest
    assert majority([Vote("a", 2, 0.5, 6), Vote("b", 2, 0.5, 3)]) == "b"  # then the first chain
    with pytest.raises(ValueError):
        majority([])


def test_the_view_samples_the_tasks_chain_of_thought_and_never_values_with_is_solved():
    task = Chains(["12"], values=[0.25])
    view = SelfConsistency(samples=4, temperature=0.9, top_p=0.8).problem_for(task)
    assert isinstance(view, SampledChains) and view.samples_per_expand == 4
    s = view.sampling
    assert (s.temperature, s.top_p, s.max_new_tokens, s.stop) == (
        0.9,
        0.8,
        task.cot_sampling.max_new_tokens,
        task.cot_sampling.stop,
    )
    state = view.parse_children("q", "sample 0")[0].state
    assert task.is_solved(state) and view.value(state) == 0.25  # the task's value, not 1 for solved
    assert SelfConsistency(samples=4).problem_for(view) is view


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"samples": 0}, "samples=0"),
        ({"samples": True}, "samples=True"),
        ({"temperature": 0.0}, "temperature"),
    ],
)
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        SelfConsistency(**kwargs)


def test_a_task_without_a_chain_of_thought_is_refused():
    class NoCot(Problem):
        def expand_prompt(self, state):
            return "x"

        def parse_children(self, state, text):
            return []

        def value(self, state):
            return 0.0

    with pytest.raises(ProblemDefinitionError, match="cot_prompt"):
        SelfConsistency().problem_for(NoCot())


def test_cli_builds_sc_from_samples_and_refuses_search_flags_it_does_not_read():
    from treesearch.cli.checks import search_strategy
    from treesearch.cli.main import build_parser
    from treesearch.common.errors import UsageError

    parse = build_parser().parse_args
    args = parse(["solve", "gsm8k", "How many?", "--strategy", "sc", "--samples", "7"])
    assert search_strategy(args) == SelfConsistency(samples=7)
    assert search_strategy(parse(["run", "gsm8k", "--strategy", "sc"])) == SelfConsistency()
    with pytest.raises(UsageError, match="--breadth does not apply to --strategy sc"):
        search_strategy(parse(["run", "gsm8k", "--strategy", "sc", "--breadth", "3"]))
    with pytest.raises(
        UsageError, match="--samples does not apply to --strategy bfs; drop it, or use it with"
    ):
        search_strategy(parse(["run", "gsm8k", "--samples", "3"]))


@pytest.mark.real_model
def test_sc_on_gsm8k_with_the_default_model_votes_over_sampled_chains(real_lm):
    """A real short search: 3 chains of the default model on one GSM8K question share one
    expansion (one generate call, the prompt's K/V computed once) and the answer is their majority."""
    from treesearch import Searcher
    from treesearch.tasks import GSM8K

    task = GSM8K(cot_max_new_tokens=48)
    question = "Tom has 3 boxes with 4 apples each. He eats 2 apples. How many are left?"
    row = {"question": question, "answer": "10"}
    r = Searcher(real_lm, task, SelfConsistency(samples=3), progress=False).solve(row)
    tree = r.tree
    kids = tree.children(0)
    assert r.stats["generate_calls"] == 1 and len(tree.node(0)["generations"]) == 3
    assert sum(tree.node(c)["samples"] for c in kids) == 3
    answers = [task.answer(tree.node(c)["state"]) for c in kids for _ in range(tree.node(c)["samples"])]
    stated = [a for a in answers if a is not None]
    if stated:
        top = max(stated.count(a) for a in stated)
        assert stated.count(r.answer) == top
        assert r.solved == (r.answer == "10")
    if r.stats["score_calls"] == 0:  # no tie to value: the prompt's tokens were computed once for 3 rows
        prompt_tokens = len(real_lm.tokenizer(task.cot_prompt(task.initial_state(row)))["input_ids"])
        assert r.stats["prefill_tokens"] <= prompt_tokens + 2
        assert r.stats["reused_tokens"] >= 2 * (prompt_tokens - 16)
