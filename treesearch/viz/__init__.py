"""Views of a ThoughtTree: inline SVG for Jupyter, a standalone HTML page, a matplotlib plot, the
KV sharing map, and GraphML / node-link exports. Nothing here fetches anything.

Users reach these through ThoughtTree's methods (`_repr_html_`, `to_html`, `plot`, `to_graphml`,
`to_node_link`, `kv_map`); the modules:
- marks.py: what each node shows (status, score colour, KV shared/own, CGEE, ASKS, evicted, hover);
- layout.py: layered top-down layout and folding of large trees;
- svg.py / page.py: the SVG and the HTML around it;  plot.py: matplotlib;
- kvmap.py: segments and the nodes that share them;  export.py: GraphML and node-link JSON.
matplotlib is imported only by `plot_tree`.
"""

from __future__ import annotations

from treesearch.viz.export import graphml_graph, node_link_data, write_graphml, write_node_link
from treesearch.viz.kvmap import KVMap, kv_map
from treesearch.viz.layout import DEFAULT_MAX_NODES, Layout, keep_set, layout
from treesearch.viz.marks import NodeMarks, node_marks, plain_kv, structure
from treesearch.viz.page import page_html, tree_html, write_html
from treesearch.viz.svg import legend_svg, render_svg, tree_view


def plot_tree(tree, ax=None, **kwargs):
    """Draw the tree with matplotlib (see `treesearch.viz.plot.plot_tree`)."""
    from treesearch.viz.plot import plot_tree as _plot

    return _plot(tree, ax, **kwargs)


__all__ = [
    "DEFAULT_MAX_NODES",
    "KVMap",
    "Layout",
    "NodeMarks",
    "graphml_graph",
    "keep_set",
    "kv_map",
    "layout",
    "legend_svg",
    "node_link_data",
    "node_marks",
    "page_html",
    "plain_kv",
    "plot_tree",
    "render_svg",
    "structure",
    "tree_html",
    "tree_view",
    "write_graphml",
    "write_html",
    "write_node_link",
]
