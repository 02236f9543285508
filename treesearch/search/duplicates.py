"""The note a search's summary adds when sampling gave no more branches than one sample would:
at some nodes every sample after the first only repeated children already found
(node["samples_repeated"], written by `treesearch.search.expansion`), so the tree is narrower than
`samples_per_expand` asks for. Greedy decoding does this to every node."""

from __future__ import annotations

from treesearch.core.tree import ThoughtTree


def repeated_samples_note(tree: ThoughtTree, temperature: float) -> str | None:
    """One line naming the nodes whose later samples all duplicated a sibling, how many children
    were merged there and the fix; None when no node's samples did."""
    nodes = [n for n in sorted(tree.graph) if tree.node(n).get("samples_repeated")]
    if not nodes:
        return None
    merged = sum(int(tree.node(n).get("merged", 0)) for n in nodes)
    why = (
        "greedy samples (temperature 0) are identical"
        if temperature == 0
        else f"at temperature {temperature:g} the samples agreed"
    )
    return (
        f"note: every sampled child of {_names(nodes)} duplicated a sibling ({merged} merged): {why}; "
        "raise --temperature for more branches"
    )


def _names(nodes: list[int]) -> str:
    """ "node #3", "nodes #0, #1 and #2", "nodes #0, #1, #2 and 4 more"."""
    ids = [f"#{n}" for n in nodes]
    if len(ids) == 1:
        return f"node {ids[0]}"
    if len(ids) <= 3:
        return "nodes " + ", ".join(ids[:-1]) + " and " + ids[-1]
    return "nodes " + ", ".join(ids[:3]) + f" and {len(ids) - 3} more"
