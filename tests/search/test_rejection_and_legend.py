"""A result says why its answer is not a solution (`SearchResult.rejection`, from the problem's
`rejection_reason`), keeps it through save/load (files from before the field still load), and the
tree views' legends say what a score is (the problem's `score_legend`, kept in the tree's meta)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from fractions import Fraction

from treesearch import SearchResult, ThoughtTree
from treesearch.cli.main import answer_lines
from treesearch.search.persist import canonical
from treesearch.tasks.game24 import Game24, Game24State
from treesearch.viz.svg import legend_svg

LEGEND = (
    "score: value in [0, 20], the model's judgement of the numbers left (sure=20, likely=1, "
    "impossible=0.001); an answer: 20 if right, 0.001 if wrong"
)


def demo_result() -> SearchResult:
    """The README demo's tree, by hand: a root and the answer "(12 * 6) * (10 - 9)"."""
    p = Game24()
    tree = ThoughtTree()
    root = tree.add_root(p.initial_state("4 5 6 10"))
    ans = tree.add_child(
        root,
        "Answer: (12 * 6) * (10 - 9) = 24",
        Game24State(puzzle=(4, 5, 6, 10), numbers=(Fraction(25),), answer="(12 * 6) * (10 - 9)"),
    )
    tree.node(ans)["score"] = 0.001
    return SearchResult(
        tree=tree, best=ans, answer="(12 * 6) * (10 - 9) = 24", solved=False, problem=p, answer_node=ans
    )


def test_an_unsolved_answer_carries_the_tasks_reason_and_the_cli_prints_it():
    res = demo_result()
    assert res.rejection == "uses 12 and 9, which the puzzle does not have"
    assert answer_lines(res) == [
        "no solution found; best attempt: (12 * 6) * (10 - 9) = 24 (node #1, value 0.00)",
        "not a solution: uses 12 and 9, which the puzzle does not have",
        "solved: no",
    ]


def test_rejection_round_trips_and_a_file_without_it_still_loads(tmp_path):
    res = demo_result()
    path = res.save(tmp_path / "r.json")
    assert SearchResult.load(path).rejection == "uses 12 and 9, which the puzzle does not have"  # no problem
    doc = json.loads(path.read_text())
    del doc["result"]["rejection"]  # a file from before the field, with its checksum
    doc["result"]["tree"]["graph"].pop("score_legend")
    import hashlib

    doc["sha256"] = hashlib.sha256(canonical(doc["result"]).encode()).hexdigest()
    path.write_text(json.dumps(doc))
    old = SearchResult.load(path)
    assert old.rejection is None and "score_legend" not in old.tree.meta
    again = SearchResult.load(path, Game24())  # with the problem, it says why again
    assert again.rejection == "uses 12 and 9, which the puzzle does not have"
    assert again.tree.meta["score_legend"] == LEGEND


def test_a_solved_result_and_one_without_an_answer_carry_no_reason():
    res = demo_result()
    solved = SearchResult(tree=res.tree, best=1, answer="x", solved=True, problem=Game24(), answer_node=1)
    none = SearchResult(tree=res.tree, best=0, answer=None, solved=False, problem=Game24(), answer_node=None)
    assert solved.rejection is None and none.rejection is None


def test_the_text_tree_legend_says_what_a_score_is():
    res = demo_result()
    assert res.tree.text_view().splitlines()[-2:] == [
        "legend: [+] expanded  [x] pruned  [*] solution  [ ] frontier",
        LEGEND,
    ]
    assert ThoughtTree().text_view() == "legend: [+] expanded  [x] pruned  [*] solution  [ ] frontier"


def test_the_svg_legend_says_what_a_score_is():
    res = demo_result()
    root = ET.fromstring(legend_svg(res.tree))
    lines = [
        t.text for t in root.iter("{http://www.w3.org/2000/svg}text") if t.get("class") == "score-legend"
    ]
    assert lines == [LEGEND] and root.get("height") == "38"
    bare = ET.fromstring(legend_svg(ThoughtTree()))
    assert bare.get("height") == "20" and "score-legend" not in legend_svg(ThoughtTree())
