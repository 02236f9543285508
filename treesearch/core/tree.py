"""`ThoughtTree`: the search tree the user sees, a `networkx.DiGraph` with one node per state.

Node attributes: state, thought, depth, score (None until evaluated), status
("frontier" | "expanded" | "pruned" | "solution"), terminal, solved, visits, value_sum (MCTS),
and `kv`, the node's handle into the KV store (never serialised). Strategies and the Searcher may
add more (e.g. prior, confidence, cgee; `samples`: how many of its parent's generations proposed
it). Node ids are consecutive ints; the root is 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import networkx as nx

from treesearch.common.errors import SaveFileError, TreeSearchError

STATUSES = ("frontier", "expanded", "pruned", "solution")
_NOT_SAVED = ("kv",)
FORMAT = "treesearch-tree/1"


class ThoughtTree:
    """A thought tree over a networkx DiGraph (`.graph`)."""

    def __init__(self) -> None:
        self.graph = nx.DiGraph()
        self.meta: dict[str, Any] = {}

    def __getstate__(self) -> dict:
        """A pickled (or deep-copied) tree leaves out the KV handles, which belong to the engine of
        the process that made them: trees come back from Ray workers this way."""
        graph = self.graph.copy()
        for n in graph:
            graph.nodes[n]["kv"] = None
        return {"graph": graph, "meta": self.meta}

    # -- building --------------------------------------------------------------------------------
    def add_root(self, state: Any, thought: str = "") -> int:
        if len(self.graph):
            raise TreeSearchError("the tree already has a root")
        return self._add(None, thought, state)

    def add_child(self, parent: int, thought: str, state: Any, **attrs: Any) -> int:
        return self._add(parent, thought, state, **attrs)

    def _add(self, parent: int | None, thought: str, state: Any, **attrs: Any) -> int:
        nid = len(self.graph)
        depth = 0 if parent is None else self.graph.nodes[parent]["depth"] + 1
        self.graph.add_node(
            nid,
            state=state,
            thought=thought,
            depth=depth,
            score=None,
            status="frontier",
            terminal=False,
            solved=False,
            visits=0,
            value_sum=0.0,
            kv=None,
            **attrs,
        )
        if parent is not None:
            self.graph.add_edge(parent, nid)
        return nid

    def set_status(self, nid: int, status: str) -> None:
        if status not in STATUSES:
            raise ValueError(f"status {status!r}; use one of {STATUSES}")
        self.graph.nodes[nid]["status"] = status

    # -- reading ---------------------------------------------------------------------------------
    @property
    def root(self) -> int:
        return 0

    def __len__(self) -> int:
        return len(self.graph)

    def __contains__(self, nid: object) -> bool:
        return nid in self.graph

    def node(self, nid: int) -> dict:
        return self.graph.nodes[nid]

    def children(self, nid: int) -> list[int]:
        return sorted(self.graph.successors(nid))

    def parent(self, nid: int) -> int | None:
        preds = list(self.graph.predecessors(nid))
        return preds[0] if preds else None

    def path(self, nid: int) -> list[int]:
        """Node ids from the root down to nid."""
        out = [nid]
        while (p := self.parent(out[-1])) is not None:
            out.append(p)
        return out[::-1]

    def nodes_with(self, **attrs: Any) -> list[int]:
        return [n for n, d in self.graph.nodes(data=True) if all(d.get(k) == v for k, v in attrs.items())]

    def leaves(self) -> list[int]:
        return [n for n in self.graph if self.graph.out_degree(n) == 0]

    # -- persistence -----------------------------------------------------------------------------
    def to_json(self, state_to_json=None) -> dict:
        """networkx node-link data (edges under "links"), kv handles left out."""
        g = nx.DiGraph()
        for n, d in self.graph.nodes(data=True):
            attrs = {k: v for k, v in d.items() if k not in _NOT_SAVED}
            if state_to_json is not None:
                attrs["state"] = state_to_json(attrs["state"])
            g.add_node(n, **attrs)
        g.add_edges_from(self.graph.edges(data=True))
        data = nx.node_link_data(g, edges="links")
        data["graph"] = {"format": FORMAT, **self.meta}
        return data

    @classmethod
    def from_json(cls, data: dict, state_from_json=None) -> ThoughtTree:
        """Rebuild a tree from `to_json` data. The data is checked whole first (node ids 0..n-1,
        one parent per node with a smaller id, depth = parent's + 1, every node attribute present
        with a valid type, statuses known): a bad file raises SaveFileError, never half-loads."""
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("nodes"), list)
            or not isinstance(data.get("links"), list)
        ):
            raise SaveFileError(
                "not a saved ThoughtTree: expected node-link JSON with 'nodes' and 'links' lists"
            )
        nodes = _check_nodes(data["nodes"])
        parents, edge_attrs = _check_links(data["links"], len(nodes))
        for n, d in enumerate(nodes):
            want = 0 if n == 0 else nodes[parents[n]]["depth"] + 1
            if d["depth"] != want:
                raise SaveFileError(
                    f"corrupt tree data: node {n} has depth {d['depth']}, its parent says {want}"
                )
        meta = data.get("graph") or {}
        if not isinstance(meta, dict):
            raise SaveFileError("corrupt tree data: 'graph' must be an object of metadata")
        if meta.get("format", FORMAT) != FORMAT:
            raise SaveFileError(
                f"tree data of format {meta.get('format')!r:.40}; this version reads {FORMAT!r}"
            )
        states = [d["state"] for d in nodes]
        if state_from_json is not None:
            for n, st in enumerate(states):
                try:
                    states[n] = state_from_json(st)
                except Exception as exc:
                    raise SaveFileError(
                        f"corrupt tree data: the state of node {n} could not be rebuilt by "
                        f"state_from_json ({type(exc).__name__}: {exc})"
                    ) from exc
        tree = cls()
        tree.meta = {k: v for k, v in meta.items() if k != "format"}
        for n, d in enumerate(nodes):
            attrs = {k: v for k, v in d.items() if k != "id"}
            attrs["state"], attrs["kv"] = states[n], None
            tree.graph.add_node(n, **attrs)
        for n in range(1, len(nodes)):
            tree.graph.add_edge(parents[n], n, **edge_attrs[n])
        return tree

    def save(self, path: str | Path, state_to_json=None) -> Path:
        """Write node-link JSON atomically (a crash never leaves a half-written file); returns the
        path, like the other writers (`SearchResult.save`, `to_html`, `to_graphml`)."""
        from treesearch.common.atomicfile import write_text_atomic

        return write_text_atomic(path, json.dumps(self.to_json(state_to_json), indent=1, default=repr))

    @classmethod
    def load(cls, path: str | Path, state_from_json=None) -> ThoughtTree:
        """Read a tree written by `save`; a truncated or corrupted file raises SaveFileError, and a
        file written by `SearchResult.save` one that points to `SearchResult.load`."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SaveFileError(f"{path} is not valid JSON (truncated or corrupted?): {exc}") from exc
        if isinstance(data, dict) and isinstance(data.get("result"), dict) and "nodes" not in data:
            raise SaveFileError(
                f"{path} is a saved search result, not a bare tree: use SearchResult.load(path, "
                "problem) and take its .tree"
            )
        return cls.from_json(data, state_from_json)

    # -- display ---------------------------------------------------------------------------------
    def text_view(self, max_nodes: int = 60, width: int = 90, *, stop: bool = True) -> str:
        """A compact indented view: id, status, score, thought; first, with `stop`, the line saying
        why the search stopped early, when it did (tree.meta["stop_reason"]); then the legend (the
        marks, and the problem's `score_legend` when the search recorded it in `meta`)."""
        lines: list[str] = []
        marks = {"frontier": " ", "expanded": "+", "pruned": "x", "solution": "*"}

        def walk(n: int, indent: int) -> None:
            if len(lines) >= max_nodes:
                return
            d = self.graph.nodes[n]
            score = "  -  " if d["score"] is None else f"{d['score']:5.2f}"
            thought = (d["thought"] or "(root)").replace("\n", " | ")
            line = f"{'  ' * indent}[{marks.get(d['status'], '?')}] #{n} {score} {thought}"
            lines.append(line[:width])
            for c in self.children(n):
                walk(c, indent + 1)

        if len(self.graph):
            walk(0, 0)
        if len(self.graph) > len(lines):
            lines.append(f"... {len(self.graph) - len(lines)} more nodes")
        lines.append("legend: [+] expanded  [x] pruned  [*] solution  [ ] frontier")
        if self.meta.get("score_legend"):  # what the score column is, as the problem defines it
            lines.append(str(self.meta["score_legend"]))
        return "\n".join(self._stop_lines(stop) + lines)

    def _stop_lines(self, stop: bool) -> list[str]:
        """The line saying why the search stopped early (none when it ran to its end, or not `stop`)."""
        from treesearch.viz.notes import stop_line

        note = stop_line(self.meta.get("stop_reason")) if stop else None
        return [note] if note else []

    def __repr__(self) -> str:
        return f"ThoughtTree({len(self.graph)} nodes)"

    # -- views and exports (implemented in treesearch.viz) ------------------------------------------
    def _repr_html_(self) -> str:
        """Jupyter's inline view: self-contained SVG (layered, coloured by score, marks, hover text)."""
        from treesearch.viz import tree_html

        return tree_html(self)

    def to_svg(self, max_nodes: int | None = 150, labels: bool | None = None) -> str:
        """The tree as one SVG element; trees over max_nodes fold their least telling nodes into +k
        markers. labels: write each node's thought on it (None: when at most 100 nodes are drawn)."""
        from treesearch.viz import render_svg

        return render_svg(self, max_nodes, labels)

    def to_html(
        self,
        path: str | Path,
        *,
        title: str | None = None,
        max_nodes: int | None = 150,
        labels: bool | None = None,
    ) -> Path:
        """Write a standalone HTML page (no script, nothing fetched) and return its path."""
        from treesearch.viz import write_html

        return write_html(self, path, title, max_nodes, labels)

    def plot(self, ax: Any = None, **kwargs: Any) -> Any:
        """Draw the tree with matplotlib on ax (a new figure when None); returns the axes."""
        from treesearch.viz import plot_tree

        return plot_tree(self, ax, **kwargs)

    def kv_map(self) -> Any:
        """Which KV-store segments each node's context runs through (`treesearch.viz.KVMap`)."""
        from treesearch.viz import kv_map

        return kv_map(self)

    def to_graphml(self, path: str | Path, state_to_json=None) -> Path:
        """Write GraphML (non-scalar attributes as JSON strings, KV marks as plain attributes)."""
        from treesearch.viz import write_graphml

        return write_graphml(self, path, state_to_json)

    def to_node_link(self, path: str | Path, state_to_json=None) -> Path:
        """Write node-link JSON like `save`, with the KV marks as plain attributes; `load` reads it back."""
        from treesearch.viz import write_node_link

        return write_node_link(self, path, state_to_json)


_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "thought": str,
    "depth": int,
    "status": str,
    "terminal": bool,
    "solved": bool,
    "visits": int,
    "value_sum": (int, float),
}


def _check_nodes(raw: list) -> list[dict]:
    """Node dicts of node-link data indexed by id, each with valid core attributes."""
    nodes: list[dict | None] = [None] * len(raw)
    for d in raw:
        nid = d.get("id") if isinstance(d, dict) else None
        if (
            isinstance(nid, bool)
            or not isinstance(nid, int)
            or not 0 <= nid < len(raw)
            or nodes[nid] is not None
        ):
            raise SaveFileError(
                f"corrupt tree data: node ids must be 0..{len(raw) - 1}, each once (got {nid!r:.40})"
            )
        if "state" not in d:
            raise SaveFileError(f"corrupt tree data: node {nid} has no state")
        for key, typ in _REQUIRED.items():
            v = d.get(key)
            if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
                raise SaveFileError(f"corrupt tree data: node {nid} attribute {key!r} is {v!r:.40}")
        score = d.get("score")
        if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))):
            raise SaveFileError(
                f"corrupt tree data: node {nid} score is {score!r:.40}, expected a number or null"
            )
        if d["status"] not in STATUSES:
            raise SaveFileError(
                f"corrupt tree data: node {nid} status {d['status']!r:.40}; known: {STATUSES}"
            )
        nodes[nid] = d
    return nodes  # type: ignore[return-value]


def _check_links(links: list, n: int) -> tuple[list[int], list[dict]]:
    """Parent of each node (root: -1) and the attributes of the edge into it, from node-link
    edges; a tree rooted at 0 or SaveFileError."""
    parents = [-1] * n
    attrs: list[dict] = [{} for _ in range(n)]
    for e in links:
        src, dst = (e.get("source"), e.get("target")) if isinstance(e, dict) else (None, None)
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n for v in (src, dst)):
            raise SaveFileError(f"corrupt tree data: edge {e!r:.60} does not join two known nodes")
        assert isinstance(src, int) and isinstance(dst, int)  # checked just above
        if not src < dst or parents[dst] != -1:
            raise SaveFileError(
                f"corrupt tree data: edge {src}->{dst}; every node has one parent with a smaller id"
            )
        parents[dst] = src
        attrs[dst] = {k: v for k, v in e.items() if k not in ("source", "target")}
    orphans = [v for v in range(1, n) if parents[v] == -1]
    if orphans:
        raise SaveFileError(f"corrupt tree data: nodes {orphans[:5]} have no parent")
    return parents, attrs
