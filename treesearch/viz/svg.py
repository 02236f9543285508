"""Self-contained SVG of a thought tree: no script, no stylesheet link, nothing fetched.

Drawing (the legend in `legend_svg` says the same to the reader, listing only the marks that occur):
- a box per node, filled by score (viridis: dark = low, yellow = high; grey = not evaluated),
  holding the score; solution nodes get a thick gold border and a star, the solution path thick
  gold edges; pruned nodes are faded with a dashed grey border; frontier nodes a dashed blue one;
- under the box, a KV bar: the node's context tokens, green where shared with other nodes'
  contexts, orange where the node's own; an evicted node's bar is hollow with a red "ev" tag;
- under the KV bar, the node's thought written out on a card, wrapped at `CHARS` characters a line
  (the root's card: the search's input), when the drawing shows at most `LABEL_NODES` nodes or
  `labels=True`; larger drawings keep the compact boxes, their thoughts in the hover text;
- a CGEE tag above the box: "skip" (verification skipped) or "L<k>" (verifier stopped after layer k);
- ASKS attachments as dashed purple arcs;
- hover (SVG <title>): thought, state, score, depth, status, visits / mean value, KV and policy marks.
Every node is a `<g class="node" data-id=...>` (its card text a `<text class="thought">`), every fold
marker a `<g class="fold" data-count=k>`, so a page's DOM can be checked against the tree. All text
is escaped: model output is data.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from html import escape
from typing import Any

from treesearch.viz.layout import DEFAULT_MAX_NODES, Layout, keep_set, layout
from treesearch.viz.marks import (
    VIRIDIS,
    NodeMarks,
    Structure,
    cgee_badge,
    node_marks,
    score_scale,
    short_score,
    structure,
    wrap_label,
)

SLOT = 54  # px per column
ROW = 74  # px per row (plus the row's tallest thought card when thoughts are drawn)
BOX_W, BOX_H = 44, 22
PAD_X, PAD_TOP, PAD_BOTTOM = 20, 26, 22
GOLD, PURPLE, BLUE, GREY = "#d4a017", "#8e44ad", "#2563eb", "#8c8c8c"
SHARED, OWN, EVICTED = "#2ca02c", "#ff7f0e", "#d62728"
# thought cards: monospace 10 px (about 6 px a character), so CHARS characters fit CARD_W
LABEL_NODES = 100  # drawings of at most this many nodes write each node's thought on it
CARD_SLOT, CARD_W, CHARS, MAX_LINES, LINE_H, CARD_GAP = 150, 140, 22, 8, 12, 8
MONO = "DejaVu Sans Mono, Menlo, Consolas, monospace"
_serial = itertools.count(1)


@dataclass
class Geometry:
    """Pixel positions of a layout: the column width, each row's box top (fold markers included), the
    thought card's lines of each node that has one, and the picture's size."""

    slot: float
    tops: list[float]
    cards: dict[int, list[str]]
    width: float
    height: float

    def centre(self, lay: Layout, n: int) -> tuple[float, float]:
        return PAD_X + self.slot / 2 + lay.x[n] * self.slot, self.tops[lay.y[n]] + BOX_H / 2

    def fold_centre(self, lay: Layout, n: int) -> tuple[float, float]:
        return PAD_X + self.slot / 2 + lay.fold_x[n] * self.slot, self.tops[lay.y[n] + 1] + BOX_H / 2

    def bottom(self, lay: Layout, n: int) -> float:
        """Where the node's edges to its children start: below its KV bar, or below its card."""
        lines = self.cards.get(n)
        if lines:
            return self.tops[lay.y[n]] + BOX_H + CARD_GAP + _card_h(lines)
        return self.tops[lay.y[n]] + BOX_H + 7


def _card_h(lines: list[str]) -> int:
    return len(lines) * LINE_H + 6


def geometry(marks: dict[int, NodeMarks], lay: Layout, labels: bool | None = None) -> Geometry:
    """Where everything goes. labels: write thoughts on the nodes (None: when at most LABEL_NODES
    nodes are drawn)."""
    if labels is None:
        labels = len(lay.x) <= LABEL_NODES
    cards = {n: wrap_label(marks[n].label, CHARS, MAX_LINES) for n in lay.x} if labels else {}
    cards = {n: lines for n, lines in cards.items() if lines}
    extra = [0.0] * lay.rows  # each row's tallest card, with the gap above it
    for n, lines in cards.items():
        extra[lay.y[n]] = max(extra[lay.y[n]], CARD_GAP + _card_h(lines))
    tops, y = [], float(PAD_TOP)
    for r in range(lay.rows):
        tops.append(y)
        y += ROW + extra[r]
    height = (tops[-1] + BOX_H + extra[-1] if tops else PAD_TOP + BOX_H) + PAD_BOTTOM
    slot = CARD_SLOT if labels else SLOT
    return Geometry(slot, tops, cards, max(lay.columns, 1) * slot + 2 * PAD_X, height)


def tree_view(
    tree: Any, max_nodes: int | None = DEFAULT_MAX_NODES
) -> tuple[Structure, dict[int, NodeMarks], Layout]:
    """Structure, marks and layout of a ThoughtTree (what both the SVG and the plot draw)."""
    st = structure(tree.graph)
    marks = node_marks(tree.graph, tree.meta, st)
    return st, marks, layout(st, keep_set(st, marks, max_nodes))


def render_svg(tree: Any, max_nodes: int | None = DEFAULT_MAX_NODES, labels: bool | None = None) -> str:
    """The tree as one <svg> element (natural size: boxes never shrink; put it in a scrolling box).
    labels: write each node's thought on it (None: when at most LABEL_NODES nodes are drawn)."""
    st, marks, lay = tree_view(tree, max_nodes)
    geo = geometry(marks, lay, labels)
    width, height = f"{geo.width:.0f}", f"{geo.height:.0f}"
    uid = f"ts{next(_serial)}"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="treesearch-tree" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="11" '
        f'data-nodes="{len(tree.graph)}" data-shown="{len(lay.x)}" data-folded="{lay.folded}" role="img" '
        f'aria-label="thought tree with {len(tree.graph)} nodes">',
        f'<defs><pattern id="{uid}-ev" width="4" height="4" patternUnits="userSpaceOnUse">'
        f'<path d="M0,4 L4,0" stroke="{EVICTED}" stroke-width="1"/></pattern></defs>',
    ]
    pos = {n: geo.centre(lay, n) for n in lay.x}
    out.append('<g class="edges" fill="none">')
    asks_edges = {(u, v) for u, v, _ in st.asks}
    for n in sorted(lay.x):
        p = st.parent.get(n)
        if p is None or p not in pos:
            continue
        on = marks[n].on_path and marks[p].on_path
        asks = (p, n) in asks_edges
        colour, w, dash = (
            (GOLD, 3, "")
            if on
            else ((PURPLE, 1.5, ' stroke-dasharray="5 3"') if asks else ("#9a9a9a", 1.2, ""))
        )
        d = _edge((pos[p][0], geo.bottom(lay, p)), pos[n])
        out.append(f'<path d="{d}" stroke="{colour}" stroke-width="{w}"{dash}/>')
    for n in lay.folds:
        out.append(
            f'<path d="{_edge((pos[n][0], geo.bottom(lay, n)), geo.fold_centre(lay, n))}" stroke="#c8c8c8" '
            'stroke-width="1" stroke-dasharray="2 2"/>'
        )
    for u, v, val in st.asks:
        if u in pos and v in pos and st.parent.get(v) != u:
            out.append(
                f'<path class="asks" d="{_arc(pos[u], pos[v])}" stroke="{PURPLE}" stroke-width="1.5" '
                f'stroke-dasharray="5 3"><title>ASKS: #{v} attached to the K/V of #{u}'
                f"{_sigma(val)}</title></path>"
            )
    out.append("</g>")
    for n in sorted(lay.x):
        out.append(_node_svg(marks[n], pos[n], uid, geo.cards.get(n)))
    for n, hidden in sorted(lay.folds.items()):
        out.append(_fold_svg(n, hidden, marks, geo.fold_centre(lay, n)))
    out.append("</svg>")
    return "".join(out)


def _edge(a: tuple[float, float], b: tuple[float, float]) -> str:
    """From a (the parent's bottom) down to the top of the box centred at b."""
    (x1, y1), (x2, y2) = a, b
    y2 -= BOX_H / 2
    mid = (y1 + y2) / 2
    return f"M{x1:.1f},{y1:.1f} C{x1:.1f},{mid:.1f} {x2:.1f},{mid:.1f} {x2:.1f},{y2:.1f}"


def _arc(a: tuple[float, float], b: tuple[float, float]) -> str:
    (x1, y1), (x2, y2) = a, b
    lift = 18 + abs(x2 - x1) * 0.15
    top = min(y1, y2) - BOX_H / 2 - lift
    return (
        f"M{x1:.1f},{y1 - BOX_H / 2:.1f} C{x1:.1f},{top:.1f} {x2:.1f},{top:.1f} {x2:.1f},{y2 - BOX_H / 2:.1f}"
    )


def _sigma(val: Any) -> str:
    return f" (sigma {val:.3f})" if isinstance(val, float) else ""


def border(m: NodeMarks) -> tuple[str, int, bool, float]:
    """A node's outline by status, shared by the SVG and matplotlib views: (colour, width level
    1-3, dashed, opacity). Pruned fades, frontier is dashed blue, solution / solution path gold."""
    colour, width, dashed, opacity = "#333333", 1, False, 1.0
    if m.status == "pruned":
        colour, dashed, opacity = GREY, True, 0.45
    elif m.status == "frontier":
        colour, dashed = BLUE, True
    if m.status == "solution":
        colour, width = GOLD, 3
    elif m.on_path:
        colour, width = GOLD, 2
    return colour, width, dashed, opacity


def _node_svg(m: NodeMarks, xy: tuple[float, float], uid: str, card: list[str] | None = None) -> str:
    x, y = xy
    left, top = x - BOX_W / 2, y - BOX_H / 2
    stroke, sw, dashed, opacity = border(m)
    dash = ' stroke-dasharray="3 2"' if dashed else ""
    text = "#ffffff" if m.dark else "#111111"
    parts = [
        f'<g class="node status-{escape(m.status)}" data-id="{m.id}" data-status="{escape(m.status)}" '
        f'opacity="{opacity}"><title>{escape(m.title)}</title>',
        f'<rect x="{left:.1f}" y="{top:.1f}" width="{BOX_W}" height="{BOX_H}" rx="5" fill="{m.fill}" '
        f'stroke="{stroke}" stroke-width="{sw}"{dash}/>',
        f'<text x="{x:.1f}" y="{y + 4:.1f}" text-anchor="middle" '
        f'fill="{text}">{escape(short_score(m.score))}</text>',
    ]
    if m.status == "solution":
        parts.append(
            f'<text x="{left - 2:.1f}" y="{top + 2:.1f}" font-size="14" fill="{GOLD}" '
            f'text-anchor="middle">★</text>'
        )
    if m.kv_tokens:
        parts.append(_kv_bar(m, left, top + BOX_H + 2, uid))
    if card:
        parts.append(_card_svg(card, x, top + BOX_H + CARD_GAP, GOLD if m.on_path else "#c8c8c8"))
    badge = cgee_badge(m.cgee)
    if badge:
        parts.append(
            f'<text class="cgee" x="{left + BOX_W:.1f}" y="{top - 3:.1f}" text-anchor="end" font-size="9" '
            f'fill="{BLUE}">{escape(badge)}</text>'
        )
    if m.asks_from:
        parts.append(
            f'<text class="asks-mark" x="{left:.1f}" y="{top - 3:.1f}" font-size="9" '
            f'fill="{PURPLE}">asks</text>'
        )
    parts.append("</g>")
    return "".join(parts)


def _card_svg(lines: list[str], x: float, top: float, edge: str) -> str:
    """The thought card: a white box under the node, the thought in monospace lines."""
    left = x - CARD_W / 2
    spans = "".join(
        f'<tspan x="{left + 5:.1f}" y="{top + 1 + LINE_H * (i + 1):.1f}">{escape(line)}</tspan>'
        for i, line in enumerate(lines)
    )
    return (
        f'<rect class="thought-card" x="{left:.1f}" y="{top:.1f}" width="{CARD_W}" height="{_card_h(lines)}" '
        f'rx="3" fill="#ffffff" stroke="{edge}" stroke-width="0.8"/>'
        f'<text class="thought" font-family="{MONO}" font-size="10" fill="#1a1a1a">{spans}</text>'
    )


def _kv_bar(m: NodeMarks, left: float, top: float, uid: str) -> str:
    w_shared = BOX_W * m.kv_shared / m.kv_tokens
    if m.evicted:
        return (
            f'<rect class="kv evicted" x="{left:.1f}" y="{top:.1f}" width="{BOX_W}" height="4" '
            f'fill="url(#{uid}-ev)" stroke="{EVICTED}" stroke-width="0.6"/>'
            f'<text x="{left + BOX_W + 2:.1f}" y="{top + 5:.1f}" font-size="8" fill="{EVICTED}">ev</text>'
        )
    return (
        f'<rect class="kv shared" x="{left:.1f}" y="{top:.1f}" width="{w_shared:.1f}" height="4" '
        f'fill="{SHARED}"/>'
        f'<rect class="kv own" x="{left + w_shared:.1f}" y="{top:.1f}" width="{BOX_W - w_shared:.1f}" '
        'height="4" '
        f'fill="{OWN}"/>'
    )


def _fold_svg(n: int, hidden: list[int], marks: dict[int, NodeMarks], xy: tuple[float, float]) -> str:
    x, y = xy
    pruned = sum(1 for h in hidden if marks[h].status == "pruned")
    scores = [s for h in hidden if (s := marks[h].score) is not None]
    best = f", best score {max(scores):.4g}" if scores else ""
    ids = ", ".join(f"#{h}" for h in hidden[:40]) + (" …" if len(hidden) > 40 else "")
    title = f"{len(hidden)} nodes folded under #{n} ({pruned} pruned{best}): {ids}"
    return (
        f'<g class="fold" data-parent="{n}" data-count="{len(hidden)}"><title>{escape(title)}</title>'
        f'<rect x="{x - 18:.1f}" y="{y - 9:.1f}" width="36" height="18" rx="9" fill="#f2f2f2" '
        'stroke="#b0b0b0"/>'
        f'<text x="{x:.1f}" y="{y + 4:.1f}" text-anchor="middle" fill="#555555">+{len(hidden)}</text></g>'
    )


def used_marks(st: Structure, marks: dict[int, NodeMarks], lay: Layout) -> list[str]:
    """The marks the drawing of this layout shows, in the legend's order: "score", "solution",
    "pruned", "frontier", "kv", "evicted", "skip" / "L<k>" (CGEE), "asks", "folded"."""
    shown = [marks[n] for n in sorted(lay.x)]
    out = ["score"] if any(m.score is not None for m in shown) else []
    out += [s for s in ("solution", "pruned", "frontier") if any(m.status == s for m in shown)]
    if any(m.kv_tokens for m in shown):
        out.append("kv")
    if any(m.kv_tokens and m.evicted for m in shown):
        out.append("evicted")
    badges = [b for m in shown if (b := cgee_badge(m.cgee))]
    out += ["skip"] if "skip" in badges else []
    out += [b for b in badges if b != "skip"][:1]
    arcs = any(u in lay.x and v in lay.x and st.parent.get(v) != u for u, v, _ in st.asks)
    if arcs or any(m.asks_from for m in shown):
        out.append("asks")
    if lay.folds:
        out.append("folded")
    return out


def legend_svg(tree: Any, max_nodes: int | None = DEFAULT_MAX_NODES) -> str:
    """The legend of the drawing `render_svg(tree, max_nodes)`: the score colour range and the marks
    that drawing shows (`used_marks`), then (when the search recorded it in the tree's meta) what a
    score means, as the problem's `score_legend` says."""
    st, marks, lay = tree_view(tree, max_nodes)
    used = used_marks(st, marks, lay)
    scale = score_scale(tree.graph)
    uid = f"ts{next(_serial)}"
    stops = "".join(
        f'<stop offset="{i / (len(VIRIDIS) - 1):.3f}" stop-color="{c}"/>' for i, c in enumerate(VIRIDIS)
    )
    x, items = 0.0, []

    def text(t: str, colour: str = "#111111", cls: str = "") -> None:
        nonlocal x
        c = f' class="{cls}"' if cls else ""
        items.append(f'<text{c} x="{x:.0f}" y="14" fill="{colour}">{escape(t)}</text>')
        x += 6.8 * len(t) + 10

    def swatch(body: str, w: float) -> None:
        nonlocal x
        items.append(body.format(x=f"{x:.0f}", x2=f"{x + w:.0f}"))
        x += w + 4

    if "score" in used:
        text(f"score {scale.lo:.3g}", cls="mark-score")
        swatch(f'<rect x="{{x}}" y="4" width="70" height="12" fill="url(#{uid}-g)"/>', 70)
        text(f"{scale.hi:.3g}" + (" (log)" if scale.log else ""))
    for label, stroke, extra in (
        ("solution", GOLD, ' stroke-width="3"'),
        ("pruned", GREY, ' stroke-dasharray="3 2" opacity="0.6"'),
        ("frontier", BLUE, ' stroke-dasharray="3 2"'),
    ):
        if label in used:
            swatch(
                f'<rect x="{{x}}" y="4" width="18" height="12" rx="3" fill="#ffffff" '
                f'stroke="{stroke}"{extra}/>',
                18,
            )
            text(label, cls=f"mark-{label}")
    if "kv" in used:
        swatch(f'<rect x="{{x}}" y="8" width="12" height="4" fill="{SHARED}"/>', 12)
        x -= 4
        swatch(f'<rect x="{{x}}" y="8" width="8" height="4" fill="{OWN}"/>', 8)
        text("KV shared / own", cls="mark-kv")
    if "evicted" in used:
        text("ev", EVICTED)
        x -= 6
        text("evicted", cls="mark-evicted")
    cgee = [u for u in used if u == "skip" or u.startswith("L")]
    if cgee:
        text(" ".join(cgee), BLUE)
        x -= 6
        text("CGEE", cls="mark-cgee")
    if "asks" in used:
        swatch(
            f'<path d="M{{x}},10 L{{x2}},10" stroke="{PURPLE}" stroke-width="1.5" stroke-dasharray="5 3"/>',
            24,
        )
        text("ASKS", cls="mark-asks")
    if "folded" in used:
        text("+k folded", cls="mark-folded")
    width, height = x, 20
    meaning = tree.meta.get("score_legend")
    if meaning:  # what a score is, as the problem defines it: a second line
        items.append(f'<text class="score-legend" x="0" y="32" fill="#111111">{escape(str(meaning))}</text>')
        width, height = max(x, 6.2 * len(str(meaning))), 38
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="treesearch-legend" width="{width:.0f}" '
        f'height="{height}" font-family="Helvetica, Arial, sans-serif" font-size="11"><defs><linearGradient '
        f'id="{uid}-g">{stops}'
        f"</linearGradient></defs>{''.join(items)}</svg>"
    )
