"""Exports through networkx: node-link JSON and GraphML, with the KV marks made plain.

A live tree holds KV handles (objects) that `ThoughtTree.save` leaves out. Both exports replace
them by plain attributes (`kv_chain` = [[segment id, used tokens], ...], `evicted`), so a tree
read back from either file shows the same KV sharing and eviction marks as the live one.

- node-link JSON: the same format as `ThoughtTree.save` (edges under "links"), so
  `ThoughtTree.load` reads it back and `networkx.node_link_graph(data, edges="links")` too.
- GraphML: attributes GraphML cannot hold (lists, dicts, states) are written as JSON strings;
  None values are left out. Read with `networkx.read_graphml(path, node_type=int)`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import networkx as nx

from treesearch.viz.marks import plain_kv


def node_link_data(tree: Any, state_to_json=None) -> dict:
    """`tree.to_json(state_to_json)` plus the plain KV attributes of live nodes."""
    data = tree.to_json(state_to_json)
    extra = plain_kv(tree.graph)
    for node in data["nodes"]:
        node.update(extra.get(node["id"], {}))
    return data


def write_node_link(tree: Any, path: str | Path, state_to_json=None) -> Path:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(node_link_data(tree, state_to_json), indent=1, default=repr), encoding="utf-8")
    tmp.replace(path)
    return path


def graphml_graph(tree: Any, state_to_json=None) -> nx.DiGraph:
    """A copy of the tree whose every attribute is a GraphML scalar (str, int, float, bool)."""
    data = node_link_data(tree, state_to_json)
    g = nx.DiGraph()
    g.graph.update({k: _scalar(v) for k, v in data["graph"].items() if v is not None})
    for node in data["nodes"]:
        attrs = {k: _scalar(v) for k, v in node.items() if k != "id" and v is not None}
        g.add_node(node["id"], **attrs)
    for link in data["links"]:
        attrs = {k: _scalar(v) for k, v in link.items() if k not in ("source", "target") and v is not None}
        g.add_edge(link["source"], link["target"], **attrs)
    return g


def write_graphml(tree: Any, path: str | Path, state_to_json=None) -> Path:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    nx.write_graphml(graphml_graph(tree, state_to_json), tmp)
    tmp.replace(path)
    return path


def _scalar(v: Any) -> Any:
    if isinstance(v, (bool, int, float, str)):
        return v
    return json.dumps(v, default=repr)
