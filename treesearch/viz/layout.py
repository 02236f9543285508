"""Layered top-down layout of a thought tree, with folding so that large trees stay readable.

Layout: a node's row is its depth. Leaves take consecutive column slots in depth-first order
(children by id) and a parent sits midway between its first and last child, so nodes of one row
never overlap (one slot each; a parent lies within its children's span) and edges never cross.

Folding (when the tree has more than `max_nodes` nodes): keep the `max_nodes` most telling nodes --
the root and the solution paths first, then unpruned before pruned, higher score, shallower, lower
id -- each together with its ancestors; every hidden subtree that hangs off a kept node is counted
into one fold marker ("+k") under that node, which takes one slot. Kept + folded = all nodes: a
500-node search with the default limit of 150 draws 150 nodes and at most 150 markers, each node
box at full size (the view scrolls rather than shrinks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from treesearch.viz.marks import NodeMarks, Structure

DEFAULT_MAX_NODES = 150


@dataclass
class Layout:
    """Positions in slot units: x = column (may be fractional), y = row (= depth)."""

    x: dict[int, float]
    y: dict[int, int]
    folds: dict[int, list[int]] = field(default_factory=dict)  # kept node -> hidden nodes below it
    fold_x: dict[int, float] = field(default_factory=dict)  # kept node -> column of its fold marker
    columns: int = 0
    rows: int = 0

    @property
    def shown(self) -> list[int]:
        return sorted(self.x)

    @property
    def folded(self) -> int:
        return sum(len(v) for v in self.folds.values())


def keep_set(st: Structure, marks: dict[int, NodeMarks], max_nodes: int | None) -> set[int]:
    """The nodes to draw: all of them, or the `max_nodes` most telling ones closed under ancestors."""
    if st.root is None:
        return set()
    nodes = list(st.parent)
    if max_nodes is None or len(nodes) <= max_nodes:
        return set(nodes)
    if max_nodes < 1:
        raise ValueError(f"max_nodes={max_nodes}; use at least 1, or None to draw every node")

    def rank(n: int) -> tuple:
        m = marks[n]
        score = m.score if m.score is not None and math.isfinite(m.score) else -math.inf
        return (n != st.root, not m.on_path, m.status == "pruned", -score, m.depth, n)

    kept: set[int] = set()
    for n in sorted(nodes, key=rank):
        chain = []
        a: int | None = n
        while a is not None and a not in kept:
            chain.append(a)
            a = st.parent[a]
        if len(kept) + len(chain) > max_nodes:
            continue
        kept.update(chain)
        if len(kept) == max_nodes:
            break
    return kept


def layout(st: Structure, keep: set[int]) -> Layout:
    """Slot positions of the kept nodes and of one fold marker per kept node with hidden children."""
    out = Layout(x={}, y={})
    if st.root is None or st.root not in keep:
        return out
    slot = 0
    # iterative post-order walk (deep trees must not hit the recursion limit)
    stack: list[tuple[int, int, bool]] = [(st.root, 0, False)]
    while stack:
        n, depth, done = stack.pop()
        if n < 0:  # a fold marker: one slot after its parent's kept children
            out.fold_x[-1 - n] = float(slot)
            slot += 1
            continue
        kids = [c for c in st.children[n] if c in keep]
        hidden = [h for c in st.children[n] if c not in keep for h in _subtree(st, c)]
        if not done:
            out.y[n] = depth
            out.rows = max(out.rows, depth + 1 + (1 if hidden else 0))
            if hidden:
                out.folds[n] = sorted(hidden)
            stack.append((n, depth, True))
            if hidden:
                stack.append((-1 - n, depth + 1, True))  # fold marker placeholder, laid out after the kids
            for c in reversed(kids):
                stack.append((c, depth + 1, False))
            continue
        xs = [out.x[c] for c in kids] + ([out.fold_x[n]] if n in out.fold_x else [])
        if xs:
            out.x[n] = (min(xs) + max(xs)) / 2
        else:
            out.x[n] = float(slot)
            slot += 1
    out.columns = slot
    return out


def _subtree(st: Structure, n: int) -> list[int]:
    out, stack = [], [n]
    while stack:
        a = stack.pop()
        out.append(a)
        stack.extend(st.children[a])
    return out
