"""The three notebooks run top to bottom with a real kernel (nbclient, the `python3` kernel of this
Python) and the default model, each in a scratch folder, each cell within a time limit. The outputs
they are checked for: the tree views (SVG with one node element per tree node), the plots, and the
cells that compare runs printing True."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
CELL_TIMEOUT = 600  # seconds per cell: a bound, not a speed test


def run(name: str):
    book = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    with tempfile.TemporaryDirectory() as scratch:
        nbclient.NotebookClient(
            book, timeout=CELL_TIMEOUT, kernel_name="python3", resources={"metadata": {"path": scratch}}
        ).execute()
        written = sorted(p.name for p in Path(scratch).iterdir())
    assert "TqdmWarning" not in stream(book)  # ipywidgets (the test extra) gives tqdm its notebook bars
    return book, written


def outputs(book, mime: str) -> list[str]:
    return [
        o["data"][mime]
        for c in book.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if mime in o.get("data", {})
    ]


def stream(book) -> str:
    return "".join(
        o.get("text", "")
        for c in book.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream"
    )


def tree_views(book) -> list[tuple[int, int]]:
    """(tree size, node elements drawn) of every inline tree view."""
    views = []
    for html in outputs(book, "text/html"):
        m = re.search(r'class="treesearch-tree"[^>]*data-nodes="(\d+)"', html)
        if m:
            views.append((int(m.group(1)), html.count('<g class="node ')))
    return views


def written_names(path: Path) -> list[str]:
    """The file names a notebook's code writes (string literals naming an output file)."""
    book = json.loads(path.read_text(encoding="utf-8"))
    code = "\n".join("".join(c["source"]) for c in book["cells"] if c["cell_type"] == "code")
    return sorted(set(re.findall(r"[\"']([\w./-]+\.(?:html|json|png|graphml|svg))[\"']", code)))


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_files_a_notebook_writes_in_notebooks_are_ignored_by_git():
    """Run in Jupyter from notebooks/, a notebook writes its pages and trees there: git ignores them."""
    names = {p.name: written_names(p) for p in sorted(NOTEBOOKS.glob("*.ipynb"))}
    assert names["01_quickstart.ipynb"] == ["quickstart_tree.html", "quickstart_tree.json"]
    for name in [n for found in names.values() for n in found]:
        out = subprocess.run(
            ["git", "check-ignore", "--no-index", f"notebooks/{name}"],
            cwd=NOTEBOOKS.parent,
            capture_output=True,
            text=True,
        )
        assert out.stdout.strip() == f"notebooks/{name}", name


def test_saved_notebooks_show_no_progress_bar_warning():
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        assert "TqdmWarning" not in stream(nbformat.read(path, as_version=4)), path.name


@pytest.mark.real_model
def test_quickstart():
    book, written = run("01_quickstart")
    views = tree_views(book)
    assert len(views) == 1 and views[0][0] == views[0][1] >= 1
    assert len(outputs(book, "image/png")) == 1
    assert "same text view: True" in stream(book)
    assert written == ["quickstart_tree.html", "quickstart_tree.json"]


@pytest.mark.real_model
def test_your_own_problem():
    book, _ = run("02_your_own_problem")
    views = tree_views(book)
    assert len(views) == 1 and views[0][0] == views[0][1] > 1
    assert any("contexts hold" in h for h in outputs(book, "text/html"))  # the KV sharing map
    assert stream(book).count("answer:") == 2


@pytest.mark.real_model
def test_inside_rksc():
    book, _ = run("03_inside_rksc")
    views = tree_views(book)
    assert len(views) == 3 and all(size == drawn > 1 for size, drawn in views)
    text = stream(book)
    assert "same tree with and without sharing: True" in text
    assert "same tree as unbounded: True" in text
    assert len(outputs(book, "image/png")) == 1
