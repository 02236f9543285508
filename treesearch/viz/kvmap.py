"""The KV sharing map of a tree: which KV-store segments each node's context runs through.

Read from the same attributes as the tree view (`kv_chain`, or a live `kv` handle). The summary
compares the tokens of every distinct context added up (what per-branch caches would hold) with
the distinct tokens of the segments they run through (what the shared store holds). Nodes with
the same chain (children parsed from one generation) are one context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from typing import Any

from treesearch.viz.marks import kv_chain, kv_evicted


@dataclass
class SegmentRow:
    segment: int
    tokens: int  # most tokens of the segment any node's context uses
    nodes: list[int]  # nodes whose contexts run through it
    evicted_nodes: list[int] = field(default_factory=list)
    contexts: int = 0  # distinct contexts that run through it

    @property
    def shared(self) -> bool:
        return self.contexts > 1


@dataclass(repr=False)
class KVMap:
    """Segments (in id order) and the sharing totals."""

    rows: list[SegmentRow]
    context_tokens: int  # sum over distinct contexts of their length
    distinct_tokens: int  # sum over segments of the tokens used
    contexts: int = 0  # distinct contexts

    @property
    def sharing_factor(self) -> float:
        """context_tokens / distinct_tokens: how many times each stored token serves a context."""
        return self.context_tokens / self.distinct_tokens if self.distinct_tokens else 0.0

    def __repr__(self) -> str:
        return (
            f"KVMap({len(self.rows)} segments, {self.contexts} contexts, {self.context_tokens} context "
            "tokens "
            f"over {self.distinct_tokens} distinct)"
        )

    def __str__(self) -> str:
        lines = [f"{'segment':>7} {'tokens':>6} {'contexts':>8}  used by"]
        for r in self.rows:
            who = " ".join(f"#{n}" for n in r.nodes[:12]) + (" ..." if len(r.nodes) > 12 else "")
            lines.append(f"{r.segment:>7} {r.tokens:>6} {r.contexts:>8}  {who}")
        lines.append(
            f"{self.contexts} contexts hold {self.context_tokens} tokens; the shared store holds "
            f"{self.distinct_tokens} "
            f"distinct tokens ({self.sharing_factor:.2f}x)"
        )
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "<tr><th>segment</th><th>tokens</th><th>contexts</th><th>used by nodes</th></tr>"
        body = []
        for r in self.rows:
            who = " ".join(f"#{n}" for n in r.nodes[:24]) + (" …" if len(r.nodes) > 24 else "")
            colour = "#e3f4e3" if r.shared else "#fff1e3"
            body.append(
                f'<tr style="background:{colour}"><td>{r.segment}</td><td>{r.tokens}</td>'
                f"<td>{r.contexts}</td><td>{escape(who)}</td></tr>"
            )
        return (
            f'<table style="font-size:12px">{head}{"".join(body)}</table>'
            f"<p>{self.contexts} contexts hold {self.context_tokens} tokens; the shared store holds "
            f"{self.distinct_tokens} "
            f"distinct tokens ({self.sharing_factor:.2f}x). Green: shared by several contexts; orange: one "
            "context's own.</p>"
        )


def kv_map(tree: Any) -> KVMap:
    """The KV sharing map of a tree (empty when no node carries KV information)."""
    rows: dict[int, SegmentRow] = {}
    seen: set[tuple] = set()
    context = 0
    for n, d in sorted(tree.graph.nodes(data=True)):
        chain = tuple(kv_chain(d) or ())
        ev = kv_evicted(d)
        if chain and chain not in seen:
            seen.add(chain)
            context += sum(u for _, u in chain)
        for s, used in chain:
            row = rows.setdefault(s, SegmentRow(segment=s, tokens=0, nodes=[]))
            row.tokens = max(row.tokens, used)
            row.nodes.append(n)
            if ev:
                row.evicted_nodes.append(n)
    for chain in seen:
        for s, _ in chain:
            rows[s].contexts += 1
    ordered = [rows[s] for s in sorted(rows)]
    return KVMap(
        rows=ordered,
        context_tokens=context,
        distinct_tokens=sum(r.tokens for r in ordered),
        contexts=len(seen),
    )
