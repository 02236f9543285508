"""The tree drawn with matplotlib, for papers and PNGs: the same layout and marks as the SVG view.

Boxes are coloured by score (viridis, with a colour bar), solution nodes have gold borders and
the solution path gold edges, pruned nodes are faded, ASKS arcs dashed purple, fold markers "+k".
Small trees (up to `label_nodes` drawn nodes) also get each node's thought written under its box,
wrapped at `label_chars` characters a line (at most `label_lines` lines; a longer one ends in "…"),
with the columns and rows spaced to fit.
"""

from __future__ import annotations

from typing import Any

from treesearch.viz.layout import DEFAULT_MAX_NODES
from treesearch.viz.marks import VIRIDIS, score_scale, short_score, wrap_label
from treesearch.viz.svg import GOLD, PURPLE, border, tree_view


def plot_tree(
    tree: Any,
    ax: Any = None,
    *,
    max_nodes: int | None = DEFAULT_MAX_NODES,
    label_nodes: int = 40,
    label_chars: int = 18,
    label_lines: int = 5,
    title: str | None = None,
) -> Any:
    """Draw the tree on `ax` (a new figure sized to the tree when None); returns the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap, LogNorm, Normalize
    from matplotlib.patches import FancyBboxPatch

    st, marks, lay = tree_view(tree, max_nodes)
    labelled = len(lay.x) <= label_nodes
    if ax is None:  # inches per column and row: room for a label_chars-wide label of 6 pt text
        col, row = (0.075 * label_chars + 0.15, 1.3 + 0.11 * label_lines) if labelled else (0.55, 1.1)
        w = min(max(6.0, col * max(lay.columns, 1) + 1.5), 60.0)
        h = min(max(3.0, row * max(lay.rows, 1) + 0.8), 30.0)
        _, ax = plt.subplots(figsize=(w, h))
    scale = score_scale(tree.graph)
    cmap = LinearSegmentedColormap.from_list("treesearch_viridis", list(VIRIDIS))
    pos = {n: (lay.x[n], -lay.y[n]) for n in lay.x}
    asks_edges = {(u, v) for u, v, _ in st.asks}
    for n in lay.x:  # edges
        p = st.parent.get(n)
        if p is None or p not in pos:
            continue
        on = marks[n].on_path and marks[p].on_path
        asks = (p, n) in asks_edges
        colour, lw, ls = (GOLD, 2.6, "-") if on else ((PURPLE, 1.2, "--") if asks else ("#9a9a9a", 0.9, "-"))
        (x1, y1), (x2, y2) = pos[p], pos[n]
        ax.plot(
            [x1, x1, x2, x2],
            [y1 - 0.18, (y1 + y2) / 2, (y1 + y2) / 2, y2 + 0.18],
            color=colour,
            lw=lw,
            ls=ls,
            zorder=1,
            solid_capstyle="round",
        )
    for u, v, _ in st.asks:
        if u in pos and v in pos and st.parent.get(v) != u:
            ax.annotate(
                "",
                xy=pos[v],
                xytext=pos[u],
                zorder=1,
                arrowprops=dict(
                    arrowstyle="-", ls="--", color=PURPLE, lw=1.2, connectionstyle="arc3,rad=-0.3"
                ),
            )
    for n, (x, y) in sorted(pos.items()):
        m = marks[n]
        edge, width, dashed, alpha = border(m)
        lw, ls = {1: 0.8, 2: 1.8, 3: 2.6}[width], "--" if dashed else "-"
        ax.add_patch(
            FancyBboxPatch(
                (x - 0.36, y - 0.15),
                0.72,
                0.3,
                boxstyle="round,pad=0.02,rounding_size=0.06",
                facecolor=m.fill,
                edgecolor=edge,
                lw=lw,
                ls=ls,
                alpha=alpha,
                zorder=2,
            )
        )
        ax.text(
            x,
            y,
            short_score(m.score),
            ha="center",
            va="center",
            fontsize=7,
            zorder=3,
            alpha=alpha,
            color="white" if m.dark else "black",
        )
        if labelled:
            thought = str(tree.graph.nodes[n].get("thought") or "")
            if thought:
                ax.text(
                    x,
                    y - 0.22,
                    "\n".join(wrap_label(thought, label_chars, label_lines)),
                    ha="center",
                    va="top",
                    fontsize=6,
                    family="monospace",
                    linespacing=1.1,
                    bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="#d0d0d0", lw=0.5),  # over the edges
                    color="#333333",
                    alpha=alpha,
                    zorder=3,
                )
    for n, hidden in lay.folds.items():
        fx, fy = lay.fold_x[n], -(lay.y[n] + 1)
        ax.plot([pos[n][0], fx], [pos[n][1] - 0.18, fy + 0.12], color="#c8c8c8", lw=0.8, ls=":", zorder=1)
        ax.text(
            fx,
            fy,
            f"+{len(hidden)}",
            ha="center",
            va="center",
            fontsize=7,
            color="#555555",
            bbox=dict(boxstyle="round,pad=0.25", fc="#f2f2f2", ec="#b0b0b0"),
            zorder=2,
        )
    norm = (
        LogNorm(scale.lo, scale.hi)
        if scale.log
        else Normalize(scale.lo, scale.hi if scale.hi > scale.lo else scale.lo + 1)
    )
    sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
    ax.figure.colorbar(sm, ax=ax, fraction=0.025, pad=0.01, label="score")
    ax.set_xlim(-0.7, max(lay.columns, 1) - 0.3)
    ax.set_ylim(-(max(lay.rows, 1) - 1) - (0.9 if labelled else 0.6), 0.5)
    ax.set_axis_off()
    shown = f" ({len(lay.x)} shown)" if len(lay.x) < len(tree.graph) else ""
    ax.set_title(title or f"{len(tree.graph)} nodes{shown}", fontsize=9)
    return ax
