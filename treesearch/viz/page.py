"""HTML around the SVG: the fragment Jupyter shows inline (`ThoughtTree._repr_html_`) and a
standalone page (`ThoughtTree.to_html`). Both are self-contained; the page also carries a
Content-Security-Policy that forbids fetching anything, so the browser proves it is offline."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from treesearch.viz.layout import DEFAULT_MAX_NODES
from treesearch.viz.svg import LABEL_NODES, legend_svg, render_svg

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def header_text(tree: Any, shown: int | None = None) -> str:
    """One line: size, what is folded, problem, input, strategy."""
    n = len(tree.graph)
    parts = [f"{n} nodes"]
    if shown is not None and shown < n:
        parts[0] += f" ({shown} shown, {n - shown} folded into +k markers)"
    for key in ("problem", "input", "strategy"):
        if tree.meta.get(key) not in (None, ""):
            parts.append(f"{key} {tree.meta[key]}")
    return "ThoughtTree · " + " · ".join(parts)


def tree_html(
    tree: Any, max_nodes: int | None = DEFAULT_MAX_NODES, max_height: int = 640, labels: bool | None = None
) -> str:
    """An HTML fragment: header, legend and the SVG in a scrolling box (Jupyter's inline view)."""
    if not len(tree.graph):
        return "<div><em>ThoughtTree (empty)</em></div>"
    svg = render_svg(tree, max_nodes, labels)
    shown = _attr_int(svg, "data-shown")
    written = 'class="thought"' in svg
    note = (
        "hover a node for its state, score and marks"
        if written
        else f"hover a node for its thought, state and marks (thoughts are written on drawings of up to "
        f"{LABEL_NODES} nodes: pass max_nodes={LABEL_NODES} or labels=True)"
    )
    return (
        f'<div class="treesearch" style="font-family:Helvetica,Arial,sans-serif;font-size:12px">'
        f'<div style="margin:2px 0">{escape(header_text(tree, shown))}</div>'
        f"<div>{legend_svg(tree, max_nodes)}</div>"
        f'<div style="overflow:auto;max-height:{max_height}px;border:1px solid #e4e4e4">{svg}</div>'
        f'<div style="color:#666;margin-top:2px">{escape(note)}</div></div>'
    )


def page_html(
    tree: Any, title: str | None = None, max_nodes: int | None = DEFAULT_MAX_NODES, labels: bool | None = None
) -> str:
    """A standalone HTML page with the tree view and a text listing of the tree."""
    title = title or header_text(tree)
    body = tree_html(tree, max_nodes, 100_000, labels) if len(tree.graph) else "<p>(empty tree)</p>"
    listing = escape(tree.text_view(max_nodes=400, width=140)) if len(tree.graph) else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>{escape(title)}</title>"
        "<style>body{font-family:Helvetica,Arial,sans-serif;margin:16px;color:#111}"
        "pre{font-size:11px;background:#f7f7f7;padding:8px;overflow:auto}</style></head><body>"
        f"{body}"
        f"<details><summary>text view</summary><pre>{listing}</pre></details></body></html>\n"
    )


def write_html(
    tree: Any,
    path: str | Path,
    title: str | None = None,
    max_nodes: int | None = DEFAULT_MAX_NODES,
    labels: bool | None = None,
) -> Path:
    """Write `page_html` to path (atomically) and return the path."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(page_html(tree, title, max_nodes, labels), encoding="utf-8")
    tmp.replace(path)
    return path


def _attr_int(svg: str, name: str) -> int | None:
    key = f'{name}="'
    i = svg.find(key)
    if i < 0:
        return None
    j = svg.find('"', i + len(key))
    return int(svg[i + len(key) : j])
