"""One-line notes the views of a tree print with it: why its search stopped early, read from
tree.meta["stop_reason"] (written by the Searcher; see `treesearch.search.stop`), and what the
tree holds (`treesearch solve` prints it under the tree)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def stop_line(reason: Mapping[str, Any] | None) -> str | None:
    """The line `stopped early (CODE): MESSAGE` for a stop reason {"code", "message"}; None for none."""
    if not isinstance(reason, Mapping) or not reason.get("code"):
        return None
    return f"stopped early ({reason['code']}): {reason.get('message', '')}".rstrip(": ")


def tree_line(tree: Any) -> str:
    """What a tree shows, in one line: its nodes, how many were expanded (and how many of the
    root's children, the branches), pruned, marked solutions and left unexpanded."""
    status = [d["status"] for _, d in tree.graph.nodes(data=True)]
    kids = tree.children(tree.root) if len(tree) else []
    branches = sum(tree.node(c)["status"] == "expanded" for c in kids)
    solutions = status.count("solution")
    parts = [
        f"{status.count('expanded')} expanded ({branches} of the root's {len(kids)} children)",
        f"{status.count('pruned')} pruned",
        f"{solutions} solution{'' if solutions == 1 else 's'}",
        f"{status.count('frontier')} left unexpanded",
    ]
    return f"tree: {len(tree)} nodes; " + ", ".join(parts)
