"""Why a search stopped (`SearchResult.stop_reason`, `treesearch.search.stop`): each code comes
from a real search on the tiny model, is printed in one line by the text tree and
`treesearch solve`, and survives a save and a load (files from before it load with None)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_problems import one_thread  # noqa: F401  (an autouse fixture)

from strategies import BFS, DFS, MCTS
from treesearch import Child, ParseError, Problem, RKSCConfig, Sampling, Searcher, SearchResult
from treesearch.core.tree import ThoughtTree
from treesearch.search.persist import load_payload, save_payload
from treesearch.search.stop import CODES, StopReason, diagnose

HEAD = "no branch reached an answer or the depth limit (3); "


class Letters(Problem):
    """Two children per node ("a", "b" appended), all valued `value`; depth 3."""

    name = "letters"
    max_depth = 3
    value_range = (0.0, 10.0)
    sampling = Sampling(max_new_tokens=3)

    def __init__(self, value: float = 1.0, raise_at: int | None = None, exc: type = KeyboardInterrupt):
        self.v, self.raise_at, self.exc = value, raise_at, exc

    def check_input(self, x) -> None:
        if not isinstance(x, str) or not x.isalpha():
            raise ParseError(f"{x!r}: use letters")

    def expand_prompt(self, state: str) -> str:
        return f"Letters: {state}"

    def parse_children(self, state: str, text: str) -> list[Child]:
        if self.raise_at is not None and len(state) >= self.raise_at:
            raise self.exc("stop here")
        return [Child(thought=c, state=state + c) for c in "ab"]

    def value(self, state: str) -> float:
        return self.v


class Stuck(Letters):
    """Every generation parses to no child."""

    def parse_children(self, state: str, text: str) -> list[Child]:
        return []


def solve(tiny_lm, problem, strategy, x="x", **config):
    return Searcher(tiny_lm, problem, strategy, RKSCConfig(**config), progress=False).solve(x)


def test_a_search_whose_expansions_parse_to_nothing_says_no_children(tiny_lm):
    r = solve(tiny_lm, Stuck(), BFS(breadth=2))
    assert len(r.tree) == 1 and r.tree.node(0)["generations"] != [""]  # text came, nothing parsed
    assert r.stop_reason == StopReason(
        "no_children", HEAD + "1 expansion gave no children (the generated text parsed to no new state)"
    )
    assert r.answer is None and r.status == "complete"
    assert r.tree.text_view().splitlines()[0] == f"stopped early (no_children): {r.stop_reason.message}"


def test_a_root_prompt_over_the_context_says_context_full(tiny_lm):
    r = solve(tiny_lm, Letters(), BFS(breadth=2), x="x" + "y" * 9000)
    assert r.tree.node(0)["context_overflow"] is True
    assert r.stop_reason == StopReason(
        "context_full", HEAD + "1 prompt did not fit the model's context window"
    )


def test_a_search_that_prunes_every_child_says_all_pruned(tiny_lm):
    r = solve(tiny_lm, Letters(value=1.0), DFS(threshold=5.0))
    assert [r.tree.node(n)["status"] for n in (1, 2)] == ["pruned", "pruned"]
    assert r.stop_reason == StopReason("all_pruned", HEAD + "2 branches were pruned")


@pytest.mark.parametrize(
    "strategy, spent",
    [
        (DFS(max_states=1), "DFS stopped when its budget (max_states=1)"),
        (MCTS(iterations=1), "MCTS stopped when its budget (iterations=1)"),
    ],
)
def test_a_strategy_that_spends_its_budget_before_any_end_says_budget(tiny_lm, strategy, spent):
    r = solve(tiny_lm, Letters(), strategy)
    assert len(r.tree) == 3  # the root expanded once; both children left unexpanded
    assert r.stop_reason == StopReason("budget", HEAD + spent + " was spent with 2 states unexplored")


def test_a_search_that_reaches_its_depth_limit_has_no_stop_reason(tiny_lm):
    r = solve(tiny_lm, Letters(), BFS(breadth=2))
    assert max(r.tree.node(n)["depth"] for n in r.tree.graph) == 3
    assert r.stop_reason is None and r.tree.meta["stop_reason"] is None
    assert not r.tree.text_view().startswith("stopped")


@pytest.mark.parametrize(
    "exc, code", [(KeyboardInterrupt, "interrupted"), (ValueError, "error"), (RuntimeError, "error")]
)
def test_an_exception_that_stops_the_search_names_itself(tiny_lm, exc, code):
    with pytest.raises(exc) as info:
        solve(tiny_lm, Letters(raise_at=2, exc=exc), BFS(breadth=2))
    part = info.value.partial_result
    assert part.status == "interrupted" and len(part.tree) == 3
    assert part.stop_reason == StopReason(code, f"the search stopped on {exc.__name__}: stop here")


def test_a_cache_budget_too_small_says_cache_budget(tiny_lm):
    with pytest.raises(Exception) as info:
        solve(tiny_lm, Letters(), BFS(breadth=2), cache_budget=5_000)
    stop = info.value.partial_result.stop_reason
    assert stop.code == "cache_budget"
    assert stop.message.startswith(
        "the search stopped on CacheBudgetError: cache_budget=5000 bytes cannot run"
    )


def test_solve_many_gives_each_result_its_own_reason(tiny_lm):
    s = Searcher(tiny_lm, Stuck(), BFS(breadth=2), progress=False)
    results = list(s.solve_many(["x", "7"], concurrency=2))
    assert [r.status for r in results] == ["complete", "invalid"]
    assert results[0].stop_reason.code == "no_children"
    assert results[1].stop_reason == StopReason(
        "invalid_input", "the input was refused: ParseError: '7': use letters"
    )


def test_a_resumed_search_ends_with_the_reason_of_an_uninterrupted_one(tiny_lm):
    with pytest.raises(KeyboardInterrupt) as info:
        solve(tiny_lm, Letters(raise_at=2), DFS(max_states=2))
    assert info.value.partial_result.stop_reason.code == "interrupted"
    whole = solve(tiny_lm, Letters(), DFS(max_states=2))
    resumed = Searcher(tiny_lm, Letters(), DFS(max_states=2), progress=False).resume(
        info.value.partial_result
    )
    assert resumed.stop_reason == whole.stop_reason and whole.stop_reason.code == "budget"


def test_the_stop_reason_survives_save_and_load_and_old_files_load_without_it(tiny_lm, tmp_path):
    r = solve(tiny_lm, Stuck(), BFS(breadth=2))
    path = r.save(tmp_path / "r.json")
    assert load_payload(path)["stop_reason"] == {"code": "no_children", "message": r.stop_reason.message}
    back = SearchResult.load(path, Stuck())
    assert back.stop_reason == r.stop_reason
    assert back.tree.text_view() == r.tree.text_view()
    old = load_payload(path)
    del old["stop_reason"]
    old["tree"]["graph"].pop("stop_reason")
    assert SearchResult.load(save_payload(tmp_path / "old.json", old), Stuck()).stop_reason is None


def test_treesearch_solve_prints_the_reason_in_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "treesearch", "solve", "game24", "4 5 6 10", "--model", "tiny",
         "--no-progress", "--breadth", "1", "--threads", "1", "--json", str(tmp_path / "r.json")],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    stop = json.loads((tmp_path / "r.json").read_text())["stop_reason"]
    line = f"stopped early ({stop['code']}): {stop['message']}"
    assert stop["code"] == "no_children"
    assert [x for x in out.stdout.splitlines() if x.startswith("stopped early")] == [line]
    assert out.stdout.splitlines().index(line) == out.stdout.splitlines().index("solved: no") + 1


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a busy machine
@given(st.lists(st.sampled_from(["empty", "pruned", "overflow", "open"]), min_size=1, max_size=6))
def test_every_early_end_is_named_by_the_first_cause_that_applies(causes):
    """A root with one child per cause: the code is the first cause present in the order
    budget (open) > context_full > no_children > all_pruned."""
    tree = ThoughtTree()
    tree.add_root("r")
    tree.set_status(0, "expanded")
    tree.node(0).update(empty_expansion=False, terminal=False)
    for cause in causes:
        c = tree.add_child(0, cause, cause)
        d = tree.node(c)
        d["terminal"] = False
        if cause == "empty":
            tree.set_status(c, "expanded")
            d["empty_expansion"], d["generations"] = True, ["x"]
        elif cause == "pruned":
            tree.set_status(c, "pruned")
        elif cause == "overflow":
            tree.set_status(c, "pruned")
            d["context_overflow"] = d["empty_expansion"] = True
    stop = diagnose(tree, limit=3)
    order = {"open": "budget", "overflow": "context_full", "empty": "no_children", "pruned": "all_pruned"}
    assert stop is not None and stop.code in CODES
    assert stop.code == next(order[k] for k in order if k in causes)
    at_limit = diagnose(tree, limit=1)  # the open children now stand at the depth limit: an end
    assert (at_limit and at_limit.code) == (None if "open" in causes else stop.code)


def test_an_expansion_whose_model_generated_nothing_names_the_likely_fix():
    """What the README's first own-problem example did: every generation was the empty string."""
    tree = ThoughtTree()
    tree.add_root("Once upon a time")
    tree.set_status(0, "expanded")
    tree.node(0).update(terminal=False, empty_expansion=True, generations=[""])
    assert diagnose(tree, limit=3) == StopReason(
        "no_children",
        HEAD + "1 expansion gave no children (the model generated no text: check expand_prompt and "
        "the sampling's stop strings)",
    )
