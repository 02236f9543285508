"""The HTML view in a real browser: headless Chromium (Debian's `chromium`, installed by .ci/run)
opens the page written by `ThoughtTree.to_html`, takes a screenshot and dumps the DOM after load.
Checked: the screenshot is a real picture (size, colours) and the DOM holds exactly one node
element per tree node (or, when folded, shown + folded = the tree's size).

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
    """Counts <g> elements by class token, and fold sizes, in a dumped DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[str] = []
        self.folds: list[int] = []
        self.svg: list[dict] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "g" and "node" in classes:
            self.nodes.append(a.get("data-id"))
        if tag == "g" and "fold" in classes:
            self.folds.append(int(a["data-count"]))
        if tag == "svg" and "treesearch-tree" in classes:
            self.svg.append(a)


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
    big = big_tree(500)
    dom = dom_of(big.to_html(out / "big_tree.html"))
    assert len(dom.nodes) == 150 and len(dom.nodes) + sum(dom.folds) == 500
