"""The HTML view in a real browser: headless Chromium (Debian's `chromium`, installed by .ci/run)
opens the page written by `ThoughtTree.to_html`, takes a screenshot and dumps the DOM after load.
Checked: the screenshot is a real picture (size, colours), the DOM holds exactly one node
element per tree node (or, when folded, shown + folded = the tree's size), each node's thought is
written in the drawing's own text (a <text> on the node, inside the picture; not only its <title>
tooltip or the collapsed text view), and the legend names only the marks that occur.

Screenshots are kept in $TREESEARCH_ARTIFACTS (default: build/browser/ in the repository).
The test skips, saying why, only when no Chromium binary can be found: under .ci/run, what its
install attempt gave (TREESEARCH_CHROMIUM_INSTALL); under a plain `make test`, which installs no
system package, that nothing tried.
"""

from __future__ import annotations

import os
from html.parser import HTMLParser
from pathlib import Path

import pytest
from browser import CHROMIUM, chromium, why_no_chromium
from viz_trees import big_tree, marked_tree, words_search

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason=why_no_chromium(os.environ.get("TREESEARCH_CHROMIUM_INSTALL"))
)


def artifacts() -> Path:
    out = Path(os.environ.get("TREESEARCH_ARTIFACTS", ROOT / "build" / "browser"))
    out.mkdir(parents=True, exist_ok=True)
    return out


class Groups(HTMLParser):
    """Counts <g> elements by class token, and fold sizes, in a dumped DOM; collects the text each
    node shows (its <text class="thought"> lines, never its <title>), the thought cards' boxes, and
    the legend's text."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[str] = []
        self.folds: list[int] = []
        self.svg: list[dict] = []
        self.written: dict[str, list[str]] = {}  # node id -> the lines drawn on it
        self.cards: list[dict] = []  # the thought cards' <rect> attributes
        self.legend: list[str] = []
        self._stack: list[str] = []  # open elements: "node:ID", "thought", "title", "legend", or the tag

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        mark = tag
        if tag == "g" and "node" in classes:
            self.nodes.append(a.get("data-id"))
            mark = f"node:{a.get('data-id')}"
        if tag == "g" and "fold" in classes:
            self.folds.append(int(a["data-count"]))
        if tag == "svg" and "treesearch-tree" in classes:
            self.svg.append(a)
        if tag == "svg" and "treesearch-legend" in classes:
            mark = "legend"
        if tag == "text" and "thought" in classes:
            mark = "thought"
        if tag == "rect" and "thought-card" in classes:
            self.cards.append(a)
        if tag not in ("rect", "path", "stop", "tspan", "meta"):  # void or nested in text: not tracked
            self._stack.append(mark)

    def handle_endtag(self, tag):
        if tag not in ("rect", "path", "stop", "tspan", "meta") and self._stack:
            self._stack.pop()

    def handle_data(self, data):
        if "title" in self._stack or "details" in self._stack:
            return
        if "thought" in self._stack:
            node = next(m for m in reversed(self._stack) if m.startswith("node:"))[5:]
            self.written.setdefault(node, []).append(data)
        elif "legend" in self._stack and data.strip():
            self.legend.append(data)


def dom_of(page: Path) -> Groups:
    g = Groups()
    g.feed(chromium(page))
    return g


def picture_stats(path: Path) -> tuple[int, int, tuple[int, int]]:
    from PIL import Image

    with Image.open(path) as im:
        rgb = im.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20) or []
        return path.stat().st_size, len(colours), rgb.size


def squeezed(text: str) -> str:
    """Text without its whitespace: wrapping moves line breaks, never characters."""
    return "".join(str(text).split())


def check_thoughts_written(tree, dom: Groups) -> None:
    """Every node shows its thought (the root: the search's input) as text inside the picture."""
    for n, d in tree.graph.nodes(data=True):
        want = d["thought"] or f"input: {tree.meta['input']}"
        assert squeezed("".join(dom.written.get(str(n), []))) == squeezed(want), (n, want)
    width, height = float(dom.svg[0]["width"]), float(dom.svg[0]["height"])
    for card in dom.cards:  # every card lies inside the picture, so none is cut off
        x, y, w, h = (float(card[k]) for k in ("x", "y", "width", "height"))
        assert 0 <= x and x + w <= width and 0 <= y and y + h <= height, (card, width, height)


def test_search_tree_renders_in_chromium(tiny_lm):
    tree = words_search(tiny_lm).tree
    out = artifacts()
    page = tree.to_html(out / "search_tree.html", title="tiny-model search")
    shot = out / "search_tree.png"
    shot.unlink(missing_ok=True)
    chromium(page, screenshot=shot)
    size, colours, dims = picture_stats(shot)
    assert dims == (1200, 800) and size > 10_000 and colours > 50, (size, colours, dims)
    dom = dom_of(page)
    assert len(dom.nodes) == len(tree) and sorted(map(int, dom.nodes)) == sorted(tree.graph)
    assert dom.folds == [] and dom.svg[0]["data-nodes"] == str(len(tree))
    check_thoughts_written(tree, dom)
    assert len(dom.cards) == len(tree)
    # the legend: what this search shows (K/V sharing, its statuses), none of what it does not
    legend = " ".join(dom.legend)
    assert "KV shared / own" in legend
    for absent in ("evicted", "CGEE", "skip", "ASKS", "+k folded"):
        assert absent not in legend
    statuses = {d["status"] for _, d in tree.graph.nodes(data=True)}
    for status in ("solution", "pruned", "frontier"):
        assert (status in legend) == (status in statuses), status


@pytest.mark.real_model
def test_a_game24_search_on_the_default_model_shows_its_thoughts_in_chromium(real_lm):
    from strategies import BFS
    from treesearch import Searcher
    from treesearch.tasks import Game24

    res = Searcher(real_lm, Game24(), BFS(breadth=2, max_depth=2), progress=False, seed=0).solve("4 5 6 10")
    tree = res.tree
    assert len(tree) >= 3  # the root and the children of its expansion
    out = artifacts()
    page = tree.to_html(out / "game24_tree.html", title="Game of 24, 4 5 6 10, SmolLM2-135M")
    shot = out / "game24_tree.png"
    shot.unlink(missing_ok=True)
    chromium(page, screenshot=shot, size="1400,900")
    size, colours, dims = picture_stats(shot)
    assert dims == (1400, 900) and size > 10_000 and colours > 50, (size, colours, dims)
    dom = dom_of(page)
    check_thoughts_written(tree, dom)
    assert sorted(map(int, dom.nodes)) == sorted(tree.graph)


def test_marks_and_folded_trees_render_in_chromium():
    out = artifacts()
    page = marked_tree().to_html(out / "marked_tree.html")
    shot = out / "marked_tree.png"
    shot.unlink(missing_ok=True)
    chromium(page, screenshot=shot, size="800,400")
    size, colours, _ = picture_stats(shot)
    assert size > 5_000 and colours > 50
    dom = dom_of(page)
    assert dom.nodes == ["0", "1", "2", "3", "4", "5", "6"]
    assert {n: "".join(v) for n, v in dom.written.items()} == {
        "0": "input: x",
        "1": "one",
        "2": "two",
        "3": "three",
        "4": "four",
        "5": "five",
        "6": "six",
    }
    assert dom.legend[0] == "score 0.5"
    for mark in ("solution", "pruned", "frontier", "KV shared / own", "evicted", "CGEE", "ASKS"):
        assert mark in dom.legend, mark
    assert "+k folded" not in dom.legend
    big = big_tree(500)
    dom = dom_of(big.to_html(out / "big_tree.html"))
    assert len(dom.nodes) == 150 and len(dom.nodes) + sum(dom.folds) == 500
    assert dom.written == {} and "+k folded" in dom.legend  # 150 nodes drawn: compact boxes
