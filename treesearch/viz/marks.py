"""What each node of a thought tree shows: structure, status, score colour, KV and policy marks,
and its hover text. Pure data (no drawing), shared by the SVG view and the matplotlib plot.

Where the marks come from (all plain node/edge attributes, so a saved tree shows the same):
- status / score / depth / thought / state / visits / value_sum: set by the Searcher and strategies.
- KV: `kv_chain` = [[segment id, tokens used], ...], the node's context in the KV store, and
  optionally `kv_reused` / `kv_prompt` (prompt tokens served from cache / in the prompt when the
  node was generated). On a live tree (before saving) the chain is read from the node's `kv`
  handle (segment, used) instead. A segment used by the contexts of two or more nodes is *shared*;
  the rest of a node's context is its *own*. Nodes with the same chain (children parsed from one
  generation) count as one context.
- `evicted` (truthy): RSBCM dropped the node's K/V; on a live tree, also when the segment its
  handle ends in holds no K/V any more.
- `cgee`: "skipped" (verification not run) | "exit@L" (scoring stopped after layer L) | "full".
- ASKS: an edge with a truthy `asks` attribute (its value may be sigma) means the target attached
  to the source's K/V. If it is the target's only in-edge it is also its tree edge; otherwise it
  is drawn as an extra arc. The same can be recorded on the node: `asks_ref` = the node whose K/V
  it attached to (and optionally `asks_sigma`), drawn as an arc.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from typing import Any

VIRIDIS = ("#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#fde725")
NO_SCORE = "#d9d9d9"


@dataclass
class Structure:
    """The tree part of the graph (ASKS arcs apart): parent and ordered children of every node."""

    root: int | None
    parent: dict[int, int | None]
    children: dict[int, list[int]]
    asks: list[tuple[int, int, Any]]  # (source, target, edge value): every edge marked asks


@dataclass
class ScoreScale:
    """Maps a score to [0, 1]: linear over [lo, hi], or logarithmic when scores span >= 100x."""

    lo: float
    hi: float
    log: bool

    def t(self, score: float | None) -> float | None:
        if score is None or not math.isfinite(score):
            return None
        if self.hi <= self.lo:
            return 0.5
        if self.log:
            s = max(score, self.lo)
            return (math.log(s) - math.log(self.lo)) / (math.log(self.hi) - math.log(self.lo))
        return min(1.0, max(0.0, (score - self.lo) / (self.hi - self.lo)))

    def colour(self, score: float | None) -> str:
        return colour_at(self.t(score))


@dataclass
class NodeMarks:
    """Everything drawn for one node."""

    id: int
    depth: int
    status: str
    score: float | None
    solved: bool
    on_path: bool
    fill: str
    dark: bool  # fill is dark: draw text in white
    kv_tokens: int = 0  # tokens of the node's context held in the KV store
    kv_shared: int = 0  # of which in segments that other contexts use too
    kv_segments: int = 0
    kv_reused: int | None = None
    kv_prompt: int | None = None
    evicted: bool = False
    cgee: str | None = None
    asks_from: list[int] = field(default_factory=list)  # nodes whose K/V this node attached to
    visits: int = 0
    mean_value: float | None = None
    title: str = ""
    label: str = ""  # the text drawn on the node: its thought (the root: the search's input)

    @property
    def kv_own(self) -> int:
        return self.kv_tokens - self.kv_shared


def structure(graph: Any) -> Structure:
    """Parent/children of each node, treating edges marked `asks` as arcs unless they are a node's only
    in-edge."""
    parent: dict[int, int | None] = {}
    asks: list[tuple[int, int, Any]] = []
    for u, v, d in graph.edges(data=True):
        if d.get("asks"):
            asks.append((u, v, d["asks"]))
    for n, d in graph.nodes(data=True):  # or as node attributes: asks_ref (node id), asks_sigma
        ref = d.get("asks_ref")
        if isinstance(ref, int) and not isinstance(ref, bool) and ref in graph and not graph.has_edge(ref, n):
            asks.append((ref, n, d.get("asks_sigma", True)))
    for n in graph.nodes:
        preds = sorted(graph.predecessors(n))
        plain = [p for p in preds if not graph.edges[p, n].get("asks")]
        parent[n] = plain[0] if plain else (preds[0] if preds else None)
    children: dict[int, list[int]] = {n: [] for n in graph.nodes}
    for n, p in parent.items():
        if p is not None:
            children[p].append(n)
    for kids in children.values():
        kids.sort()
    roots = sorted(n for n, p in parent.items() if p is None)
    return Structure(root=roots[0] if roots else None, parent=parent, children=children, asks=asks)


def solution_nodes(graph: Any, meta: dict | None = None) -> list[int]:
    """Nodes the search marked as solutions, plus meta["best"] when recorded. A node that is solved
    but was pruned (e.g. BFS kept other solved siblings) is not one: its hover text says "solved"."""
    out = [n for n, d in graph.nodes(data=True) if d.get("status") == "solution"]
    best = (meta or {}).get("best")
    if isinstance(best, int) and best in graph and best not in out:
        out.append(best)
    return sorted(out)


def path_nodes(st: Structure, ends: list[int]) -> set[int]:
    """Every node on a root path to one of `ends`."""
    seen: set[int] = set()
    for end in ends:
        n: int | None = end
        while n is not None and n not in seen:
            seen.add(n)
            n = st.parent.get(n)
    return seen


def score_scale(graph: Any) -> ScoreScale:
    scores = [
        float(d["score"])
        for _, d in graph.nodes(data=True)
        if isinstance(d.get("score"), (int, float)) and math.isfinite(d["score"])
    ]
    if not scores:
        return ScoreScale(0.0, 1.0, False)
    lo, hi = min(scores), max(scores)
    return ScoreScale(lo, hi, lo > 0 and hi / lo >= 100)


def colour_at(t: float | None) -> str:
    """Viridis at t in [0, 1] (linear between nine stops); grey for None."""
    if t is None:
        return NO_SCORE
    x = min(1.0, max(0.0, t)) * (len(VIRIDIS) - 1)
    i = min(int(x), len(VIRIDIS) - 2)
    f = x - i
    a, b = _rgb(VIRIDIS[i]), _rgb(VIRIDIS[i + 1])
    return "#" + "".join(f"{round(p + (q - p) * f):02x}" for p, q in zip(a, b))


def is_dark(hex_colour: str) -> bool:
    r, g, b = _rgb(hex_colour)
    return 0.299 * r + 0.587 * g + 0.114 * b < 140


def _rgb(h: str) -> tuple[int, int, int]:
    return int(h[1:3], 16), int(h[3:5], 16), int(h[5:7], 16)


# -- KV --------------------------------------------------------------------------------------------
def kv_chain(d: dict) -> list[tuple[int, int]] | None:
    """A node's context in the KV store as [(segment id, used tokens)], from a live `kv` handle, else
    from a `kv_chain` attribute (written by the exports)."""
    handle = d.get("kv")
    if handle is not None:
        seg, used = handle
        return [(s.id, u) for s, u in seg.context_chain(used)]
    if d.get("kv_chain") is not None:
        return [(int(s), int(u)) for s, u in d["kv_chain"]]
    return None


def kv_evicted(d: dict) -> bool:
    """True when the node's K/V was evicted: the `evicted` attribute, or a live handle whose end holds no
    K/V."""
    if d.get("evicted"):
        return True
    handle = d.get("kv")
    if handle is not None:
        seg = handle[0]
        return getattr(seg, "kv", True) is None
    return False


def plain_kv(graph: Any) -> dict[int, dict]:
    """node -> {"kv_chain": [[seg, used], ...], "evicted": bool} for nodes with KV: what a saved tree
    needs to show the same KV marks as the live one."""
    out = {}
    for n, d in graph.nodes(data=True):
        chain = kv_chain(d)
        if chain is not None:
            out[n] = {"kv_chain": [[s, u] for s, u in chain], "evicted": kv_evicted(d)}
    return out


def segment_users(graph: Any) -> dict[int, set[tuple]]:
    """segment id -> the distinct contexts (chains) that run through it. Nodes with the same chain
    (e.g. several children parsed from one generation) are one context: their K/V is one thing."""
    users: dict[int, set[tuple]] = {}
    for _, d in graph.nodes(data=True):
        chain = tuple(kv_chain(d) or ())
        for s, _ in chain:
            users.setdefault(s, set()).add(chain)
    return users


# -- all marks -------------------------------------------------------------------------------------
def node_marks(graph: Any, meta: dict | None = None, st: Structure | None = None) -> dict[int, NodeMarks]:
    """The marks of every node (see the module docstring for the attributes read)."""
    st = st or structure(graph)
    scale = score_scale(graph)
    on_path = path_nodes(st, solution_nodes(graph, meta))
    users = segment_users(graph)
    asks_in: dict[int, list[int]] = {}
    for u, v, _ in st.asks:
        asks_in.setdefault(v, []).append(u)
    out: dict[int, NodeMarks] = {}
    for n, d in graph.nodes(data=True):
        score = d.get("score")
        score = float(score) if isinstance(score, (int, float)) and not isinstance(score, bool) else None
        fill = scale.colour(score)
        m = NodeMarks(
            id=n,
            depth=int(d.get("depth", 0)),
            status=str(d.get("status", "frontier")),
            score=score,
            solved=bool(d.get("solved")),
            on_path=n in on_path,
            fill=fill,
            dark=is_dark(fill),
            evicted=kv_evicted(d),
            cgee=d.get("cgee"),
            asks_from=sorted(asks_in.get(n, [])),
            visits=int(d.get("visits") or 0),
            kv_reused=d.get("kv_reused"),
            kv_prompt=d.get("kv_prompt"),
        )
        if m.visits:
            m.mean_value = float(d.get("value_sum") or 0.0) / m.visits
        chain = kv_chain(d)
        if chain:
            m.kv_segments = len(chain)
            m.kv_tokens = sum(u for _, u in chain)
            m.kv_shared = sum(u for s, u in chain if len(users.get(s, ())) > 1)
        m.title = hover_text(n, d, m)
        m.label = node_label(d, m, meta)
        out[n] = m
    return out


def hover_text(n: int, d: dict, m: NodeMarks, width: int = 300) -> str:
    """The node's tooltip: thought, state, score, depth, status, MCTS visits/value, KV and policy marks."""
    lines = [f"#{n} · depth {m.depth} · {m.status}" + (" · solved" if m.solved else "")]
    thought = d.get("thought") or ("(root)" if m.depth == 0 else "")
    lines.append(f"thought: {_clip(thought, width)}")
    lines.append(
        f"state: {_clip(repr(d.get('state')) if not isinstance(d.get('state'), str) else d['state'], width)}"
    )
    score = "not evaluated" if m.score is None else f"{m.score:.4g}"
    probs = d.get("label_probs")
    if isinstance(probs, dict) and probs:
        score += " (" + ", ".join(f"{str(k).strip()} {float(v):.2f}" for k, v in probs.items()) + ")"
    lines.append(f"score: {score}")
    if m.visits:
        lines.append(f"visits: {m.visits} · mean value {m.mean_value:.4g}")
    if m.kv_tokens:
        kv = (
            f"KV: {m.kv_tokens} context tokens in {m.kv_segments} segments; "
            f"{m.kv_shared} shared, {m.kv_own} own"
        )
        if m.kv_reused is not None and m.kv_prompt:
            kv += f"; {m.kv_reused} of {m.kv_prompt} prompt tokens reused from cache"
        lines.append(kv)
    if m.evicted:
        lines.append("KV evicted by RSBCM (recomputed from the nearest cached ancestor if needed)")
    if m.cgee:
        lines.append("CGEE: " + cgee_text(m.cgee))
    if m.asks_from:
        lines.append("ASKS: attached to the K/V of " + ", ".join(f"#{a}" for a in m.asks_from))
    return "\n".join(lines)


def node_label(d: dict, m: NodeMarks, meta: dict | None = None) -> str:
    """What the node says, drawn on it: its thought; for a root without one, the search's input
    (tree.meta["input"]) or else its state."""
    thought = str(d.get("thought") or "")
    if thought or m.depth:
        return thought
    given = (meta or {}).get("input")
    return f"input: {given if given not in (None, '') else d.get('state')}"


def wrap_label(text: str, width: int, max_lines: int) -> list[str]:
    """`text` in lines of at most `width` characters (long words broken), at most `max_lines` of
    them; a cut text ends in "…"."""
    lines = textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False)
    if len(lines) <= max_lines:
        return lines
    return lines[: max_lines - 1] + [lines[max_lines - 1][: width - 1] + "…"]


def cgee_text(mark: str) -> str:
    if mark == "skipped":
        return "verification skipped (generation was decisive)"
    if mark.startswith("exit@"):
        return f"verifier stopped after layer {mark[5:]}"
    if mark == "full":
        return "full verification pass"
    return str(mark)


def cgee_badge(mark: str | None) -> str | None:
    """Short badge text: "skip" or "L12"; None for a full pass or no mark."""
    if not mark or mark == "full":
        return None
    if mark == "skipped":
        return "skip"
    if mark.startswith("exit@"):
        return "L" + mark[5:]
    return str(mark)[:5]


def short_score(s: float | None) -> str:
    """A score in at most 4 characters for the node box."""
    if s is None:
        return "–"
    a = abs(s)
    if a >= 10:
        return f"{s:.0f}"
    if a >= 1:
        return f"{s:.1f}"
    return f"{s:.2f}"


def _clip(text: str, width: int) -> str:
    text = str(text).replace("\r", "")
    return text if len(text) <= width else text[: width - 1] + "…"
