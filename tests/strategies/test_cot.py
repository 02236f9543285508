"""The chain-of-thought baseline (`strategies.CoT`, `treesearch.core.cot.ChainOfThought`): one
generation from the task's `cot_prompt`, no search; the answer is the task's `parse_cot` of that
generation; the tree is the root and one child, so `run`'s rows, accuracy and resume work as for
a search."""

from __future__ import annotations

import json

import pytest

from strategies import BFS, CoT
from treesearch import Problem, ProblemDefinitionError, RKSCConfig, Sampling, Searcher
from treesearch.common.seeds import stable_seed
from treesearch.core.cot import ChainOfThought, problem_for
from treesearch.core.problem import Child
from treesearch.tasks import GSM8K, Game24


class Echo(Problem):
    """A task whose chain of thought's answer is known from its text: the generation's first
    eight characters, upper-cased; solved when that starts with "A"."""

    name = "echo"

    def cot_prompt(self, state):
        return f"Question: {state}\nAnswer:"

    def parse_cot(self, state, text):
        return {"question": state, "answer": text[:8].upper()}

    def expand_prompt(self, state):  # the task's own search prompt (CoT never uses it)
        return f"Search: {state}"

    def parse_children(self, state, text):
        return [Child(thought=text, state=state)]

    def value(self, state):
        return 0.0

    def answer(self, state):
        return state["answer"] if isinstance(state, dict) else None

    def is_terminal(self, state):
        return isinstance(state, dict)

    def is_solved(self, state):
        return isinstance(state, dict) and state["answer"].startswith("A")


def test_cot_tree_is_the_root_and_one_child_holding_the_one_generation(tiny_lm):
    s = Sampling(max_new_tokens=12)
    result = Searcher(tiny_lm, Echo(), CoT(), sampling=s, progress=False).solve("two and two")
    tree = result.tree
    assert sorted(tree.graph) == [0, 1] and tree.children(0) == [1]
    assert result.stats["generate_calls"] == 1 and result.stats["score_calls"] == 0
    assert result.stats["generated_tokens"] == 12
    (text,) = tree.node(0)["generations"]
    assert tree.node(1)["thought"] == text.strip()
    assert tree.node(1)["state"] == {"question": "two and two", "answer": text[:8].upper()}
    assert result.best == result.answer_node == 1
    assert result.answer == text[:8].upper() and result.solved is text[:8].upper().startswith("A")
    assert tree.node(1)["score"] == (1.0 if result.solved else 0.0)


def test_cot_answer_is_the_tasks_parse_of_the_models_own_generation(tiny_lm):
    """The generation is what the engine gives for the task's cot_prompt alone (same seed), and
    the answer is the task's parse of exactly that text."""
    from treesearch.engine.local import Engine

    task, s = Echo(), Sampling(max_new_tokens=10)
    alone = Engine(tiny_lm, RKSCConfig()).generate([task.cot_prompt("q")], s, seeds=[stable_seed(0, 0, 0)])
    result = Searcher(tiny_lm, task, CoT(), sampling=s, progress=False).solve("q")
    assert result.tree.node(0)["generations"] == [alone[0].text]
    assert result.tree.node(0)["generation_ids"] == [list(alone[0].token_ids)]
    assert result.answer == alone[0].text[:8].upper()


def test_sampled_cot_follows_the_seed(tiny_lm):
    s = Sampling(max_new_tokens=8, temperature=1.0)

    def text(seed):
        r = Searcher(tiny_lm, Echo(), CoT(), sampling=s, seed=seed, progress=False).solve("q")
        return r.tree.node(0)["generations"][0]

    assert text(3) == text(3)
    assert len({text(seed) for seed in range(4)}) > 1  # the random model's sampled texts differ by seed


@pytest.mark.parametrize(
    "text, answer, solved",
    [
        ("10 - 6 = 4 (left: 4 4 5)\nAnswer: (10 - 6) * 5 + 4 = 24", "(10 - 6) * 5 + 4 = 24", True),
        ("Answer: (10 - 4) * (6 - 5) * 4 = 24", "(10 - 4) * (6 - 5) * 4 = 24", False),  # 4 twice
        # the answer is the line as written, never rewritten to "= 24" (it was "4 * (6 + 10 / 5) = 24")
        ("Answer: 4 * (6 + 10 / 5) = 32\nAnswer: (10 - 6) * 5 + 4 = 24", "4 * (6 + 10 / 5) = 32", False),
        ("  Answer: (10 - 6) * 5 + 4", "(10 - 6) * 5 + 4", True),  # (it was "(10 - 6) * 5 + 4 = 24")
        ("no answer line at all", None, False),
        ("Answer: = 24", None, False),
    ],
)
def test_game24_cot_answer_is_the_first_answer_line_as_written(text, answer, solved):
    g = Game24()
    root = g.initial_state("4 5 6 10")
    state = g.parse_cot(root, text)
    assert (g.answer(state), g.is_solved(state)) == (answer, solved)
    if answer is None:
        assert state == root  # no answer: the chain of thought got nowhere


def test_gsm8k_cot_reads_the_answer_and_checks_it_against_the_reference():
    q = GSM8K()
    root = q.initial_state({"question": "Tom has 3 boxes of 4 apples. How many?", "answer": "... #### 12"})
    text = " He has 3 * 4 = 12 apples.\nThe answer is 12."
    state = q.parse_cot(root, text)
    assert state.steps == ("He has 3 * 4 = 12 apples.", "The answer is 12.")
    assert q.answer(state) == "12" and q.is_solved(state)
    wrong = q.parse_cot(root, " 3 + 4 = 7, so 7 apples")
    assert q.answer(wrong) == "7" and not q.is_solved(wrong)  # no "answer is": the last number
    assert q.parse_cot(root, " I do not know.").answer is None


def test_cot_prompts_end_where_the_model_writes_the_reasoning():
    g, q = Game24(), GSM8K()
    assert g.cot_prompt(g.initial_state("4 5 6 10")).endswith("Input: 4 5 6 10\nSteps:\n")
    assert q.cot_prompt(q.initial_state("Two plus two?")).endswith("Question: Two plus two?\nAnswer:")
    assert g.cot_sampling.temperature == 0 and q.cot_sampling.temperature == 0  # greedy by default


def test_game24_cot_examples_are_right_and_not_test_puzzles():
    import re

    from treesearch.tasks.game24 import COT_PROMPT, check_answer, load_puzzles

    shots = re.findall(r"Input: (.*)\nSteps:\n(?:.*\n){3}Answer: (.*)", COT_PROMPT)
    assert len(shots) == 5
    test_set = set(load_puzzles(900, 1000))
    assert [(check_answer(a, p), p in test_set) for p, a in shots] == [(True, False)] * 5


def test_the_searcher_runs_cot_on_the_tasks_chain_of_thought_view(tiny_lm):
    s = Searcher(tiny_lm, Game24(), CoT(), progress=False)
    assert isinstance(s.problem, ChainOfThought) and s.problem.name == "game24"
    assert s.sampling == Game24().cot_sampling
    assert problem_for(CoT(), s.problem) is s.problem  # the view of a view is itself
    assert problem_for(BFS(), s.problem.task) is s.problem.task  # other strategies: the task


class Plain(Echo):
    cot_prompt = Problem.cot_prompt  # a task with no chain of thought


def test_a_task_without_a_cot_prompt_is_refused_naming_the_fix(tiny_lm):
    with pytest.raises(ProblemDefinitionError, match=r"define Plain.cot_prompt\(state\) and Plain.parse_cot"):
        Searcher(tiny_lm, Plain(), CoT(), progress=False)


def test_cot_resumes_after_an_interruption_to_the_uninterrupted_tree(tiny_lm, tmp_path):
    class Breaks(Echo):
        def parse_cot(self, state, text):
            raise KeyboardInterrupt

    s = Sampling(max_new_tokens=6)
    ref = Searcher(tiny_lm, Echo(), CoT(), sampling=s, progress=False).solve("q")
    with pytest.raises(KeyboardInterrupt) as info:
        Searcher(tiny_lm, Breaks(), CoT(), sampling=s, progress=False).solve("q")
    part = info.value.partial_result
    assert len(part.tree) == 1  # the expansion is all or nothing
    resumed = Searcher(tiny_lm, Echo(), CoT(), sampling=s, progress=False).resume(part)
    assert resumed.tree.node(1)["state"] == ref.tree.node(1)["state"] and resumed.answer == ref.answer
    again = Searcher(tiny_lm, Echo(), CoT(), sampling=s, progress=False).resume(resumed)
    assert again.stats["generate_calls"] == 0 and len(again.tree) == 2


def test_run_strategy_cot_writes_a_row_per_input_and_the_accuracy(tmp_path, capsys):
    from treesearch.cli.main import main
    from treesearch.tasks.game24 import load_puzzles

    out, summary = tmp_path / "cot.jsonl", tmp_path / "summary.json"
    argv = ["run", "game24", "--strategy", "cot", "--model", "tiny", "--range", "900:903", "--no-progress"]
    assert main([*argv, "--threads", "1", "--out", str(out), "--json", str(summary)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == [900, 901, 902]
    assert [r["input"] for r in rows] == load_puzzles(900, 903)
    assert all(r["status"] == "complete" and r["stats"]["generate_calls"] == 1 for r in rows)
    assert all(r["stats"]["score_calls"] == 0 for r in rows)
    printed = capsys.readouterr().out
    s = json.loads(summary.read_text())
    assert s["inputs"] == 3 and s["solved"] == sum(r["solved"] for r in rows)
    assert f"solved {s['solved']} of 3, accuracy" in printed and "95% CI" in printed


def test_solve_strategy_cot_prints_the_two_node_tree(capsys):
    from treesearch.cli.main import main

    argv = ["solve", "gsm8k", "Tom has 3 boxes of 4 apples. How many?", "--strategy", "cot"]
    assert main([*argv, "--model", "tiny", "--no-progress", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "#0" in out and "#1" in out and "#2" not in out
    assert "score: 1 if the chain of thought's answer solves the task, else 0" in out


def test_cot_many_at_once_gives_each_inputs_result_alone(tiny_lm):
    from treesearch.tasks.game24 import load_puzzles

    g, puzzles = Game24(cot_max_new_tokens=10), load_puzzles(900, 904)
    alone = [Searcher(tiny_lm, g, CoT(), progress=False).solve(p) for p in puzzles]
    many = list(Searcher(tiny_lm, g, CoT(), progress=False).solve_many(puzzles, concurrency=3))
    assert [r.tree.node(0)["generation_ids"] for r in many] == [
        r.tree.node(0)["generation_ids"] for r in alone
    ]
    assert [(r.answer, r.solved, len(r.tree)) for r in many] == [(r.answer, r.solved, 2) for r in alone]


@pytest.mark.real_model
def test_cot_on_the_default_model_runs_one_game24_row_end_to_end(real_lm, tmp_path):
    """One row through run's pipeline (results file and summary), 24 tokens of chain of thought."""
    from treesearch.runs.results_file import ResultsFile, run_inputs

    g = Game24(cot_max_new_tokens=24)
    searcher = Searcher(real_lm, g, CoT(), progress=False)
    with ResultsFile(tmp_path / "cot.jsonl") as out:
        summary = run_inputs(searcher, [(900, "4 5 6 10")], out, progress=False)
    (row,) = [json.loads(line) for line in (tmp_path / "cot.jsonl").read_text().splitlines()]
    assert row["status"] == "complete" and row["stats"]["generate_calls"] == 1
    assert 0 < row["stats"]["generated_tokens"] <= 24
    assert summary.searched == 1 and summary.solved == int(row["solved"])
    result = searcher.solve("4 5 6 10")  # the same greedy generation, to read its tree
    (text,) = result.tree.node(0)["generations"]
    state = g.parse_cot(result.tree.node(0)["state"], text)
    assert result.tree.node(1)["state"] == state and row["answer"] == g.answer(state)
    assert row["solved"] is g.is_solved(state)
