"""The tree views and exports: exact marks on a hand-built tree, folding at 500 nodes, layout
invariants (hypothesis), round trips of save / node-link / GraphML, matplotlib, and a real
tiny-model search whose live KV marks survive export."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import matplotlib

matplotlib.use("Agg")

import networkx as nx  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as hs  # noqa: E402
from viz_trees import big_tree, marked_tree, words_search  # noqa: E402

from treesearch.core.tree import ThoughtTree  # noqa: E402
from treesearch.viz import keep_set, kv_map, layout, node_marks, structure  # noqa: E402
from treesearch.viz.marks import ScoreScale, colour_at, short_score  # noqa: E402
from treesearch.viz.svg import GOLD, legend_svg  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def groups(root: ET.Element, cls: str) -> list[ET.Element]:
    return [g for g in root.iter(SVG + "g") if cls in (g.get("class") or "").split()]


def title_of(g: ET.Element) -> str:
    return g.find(SVG + "title").text


# -- the hand-built tree -------------------------------------------------------------------------------
def test_every_node_drawn_once_with_its_status():
    t = marked_tree()
    root = parse(t.to_svg())
    nodes = groups(root, "node")
    assert [int(g.get("data-id")) for g in nodes] == [0, 1, 2, 3, 4, 5, 6]
    assert [g.get("data-status") for g in nodes] == [
        "expanded",
        "expanded",
        "pruned",
        "frontier",
        "solution",
        "pruned",
        "frontier",
    ]
    assert root.get("data-nodes") == "7" and root.get("data-shown") == "7" and root.get("data-folded") == "0"
    assert [g.get("opacity") for g in nodes] == ["1.0", "1.0", "0.45", "1.0", "1.0", "0.45", "1.0"]


def test_solution_path_and_marks():
    t = marked_tree()
    t.node(5)["solved"] = True  # solved but pruned: not a solution, no gold
    root = parse(t.to_svg())
    gold_edges = [p for p in root.find(SVG + "g").iter(SVG + "path") if p.get("stroke") == GOLD]
    assert len(gold_edges) == 2  # 0 -> 1 -> 4
    by_id = {int(g.get("data-id")): g for g in groups(root, "node")}
    assert by_id[4].find(SVG + "rect").get("stroke-width") == "3"
    assert by_id[1].find(SVG + "rect").get("stroke-width") == "2"  # on the path
    assert by_id[5].find(SVG + "rect").get("stroke-width") == "1"
    badges = {n: [x.text for x in g.iter(SVG + "text") if x.get("class") == "cgee"] for n, g in by_id.items()}
    assert badges == {0: [], 1: [], 2: ["skip"], 3: [], 4: ["L12"], 5: [], 6: []}
    assert [
        n for n, g in by_id.items() if any(x.get("class") == "asks-mark" for x in g.iter(SVG + "text"))
    ] == [3]
    evicted = [
        n for n, g in by_id.items() if any("evicted" in (r.get("class") or "") for r in g.iter(SVG + "rect"))
    ]
    assert evicted == [5]
    kv = {
        n: [
            (r.get("class"), r.get("width"))
            for r in g.iter(SVG + "rect")
            if (r.get("class") or "").startswith("kv")
        ]
        for n, g in by_id.items()
    }
    # node 1: chain (1,10) shared, (2,5) shared (also in 4's and 5's contexts) -> all 15 shared
    assert kv[1] == [("kv shared", "44.0"), ("kv own", "0.0")]
    # node 4: 15 shared of 21 -> 44 * 15 / 21 = 31.4
    assert kv[4] == [("kv shared", "31.4"), ("kv own", "12.6")]
    # nodes 2 and 3 have the same chain (one generation): one context, segment 3 is theirs alone
    assert kv[2] == [("kv shared", "29.3"), ("kv own", "14.7")]
    assert kv[6] == [] and kv[0] == []


def test_hover_text_holds_thought_state_score_depth_visits_and_marks():
    t = marked_tree()
    by_id = {int(g.get("data-id")): title_of(g) for g in groups(parse(t.to_svg()), "node")}
    assert by_id[4].splitlines() == [
        "#4 · depth 2 · solution · solved",
        "thought: four",
        "state: s-four",
        "score: 20",
        "KV: 21 context tokens in 3 segments; 15 shared, 6 own",
        "CGEE: verifier stopped after layer 12",
    ]
    assert "visits: 3 · mean value 0.5" in by_id[6].splitlines()
    assert "score: not evaluated" in by_id[6].splitlines()
    assert "CGEE: verification skipped (generation was decisive)" in by_id[2]
    assert "ASKS: attached to the K/V of #0" in by_id[3]
    assert "KV evicted by RSBCM (recomputed from the nearest cached ancestor if needed)" in by_id[5]
    assert by_id[0].splitlines()[1] == "thought: (root)"


def test_model_text_is_escaped_and_nothing_is_fetched():
    t = marked_tree()
    t.node(1)["thought"] = '<script>alert("x")</script> & <img src=http://example.com/a.png>'
    html = t._repr_html_()
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;" in html
    plain = marked_tree()._repr_html_()
    assert plain.count("http") == plain.count("http://www.w3.org/2000/svg")  # only the SVG namespace
    assert " src=" not in plain and "href=" not in plain and "@import" not in plain
    svg = t.to_svg()
    assert (
        title_of(groups(parse(svg), "node")[1]).splitlines()[1]
        == 'thought: <script>alert("x")</script> & <img src=http://example.com/a.png>'
    )


def test_asks_arc_when_not_the_tree_edge():
    t = marked_tree()
    t.graph.edges[0, 3]["asks"] = 0  # not marked any more
    t.graph.add_edge(5, 6, asks=0.995)  # 6 attached to 5's K/V; its tree parent stays 1
    st = structure(t.graph)
    assert st.parent[6] == 1 and st.children[1] == [4, 5, 6] and st.asks == [(5, 6, 0.995)]
    arcs = [p for p in parse(t.to_svg()).iter(SVG + "path") if p.get("class") == "asks"]
    assert [title_of(a) for a in arcs] == ["ASKS: #6 attached to the K/V of #5 (sigma 0.995)"]
    t.node(4).update(asks_ref=2, asks_sigma=0.981)  # the node-attribute form
    arcs = [p for p in parse(t.to_svg()).iter(SVG + "path") if p.get("class") == "asks"]
    assert [title_of(a) for a in arcs] == [
        "ASKS: #6 attached to the K/V of #5 (sigma 0.995)",
        "ASKS: #4 attached to the K/V of #2 (sigma 0.981)",
    ]
    assert "ASKS: attached to the K/V of #2" in title_of(groups(parse(t.to_svg()), "node")[4])


# -- layout and folding --------------------------------------------------------------------------------
def test_layout_is_exact_on_a_small_tree():
    t = marked_tree()
    st = structure(t.graph)
    lay = layout(st, set(t.graph))
    # leaves in depth-first order: 4, 5, 6, 2, 3 take slots 0..4; 1 sits over 4..6, 0 over 1..3
    assert lay.x == {4: 0.0, 5: 1.0, 6: 2.0, 1: 1.0, 2: 3.0, 3: 4.0, 0: 2.5}
    assert lay.y == {0: 0, 1: 1, 2: 1, 3: 1, 4: 2, 5: 2, 6: 2}
    assert (lay.columns, lay.rows, lay.folds) == (5, 3, {})


def test_folding_keeps_the_most_telling_nodes():
    t = marked_tree()
    st = structure(t.graph)
    marks = node_marks(t.graph, t.meta, st)
    # root, solution path (1, 4), then unpruned by score: 3 (2.0), 6 (None) ... limit 4 -> {0, 1, 4, 3}
    assert keep_set(st, marks, 4) == {0, 1, 3, 4}
    lay = layout(st, {0, 1, 3, 4})
    assert lay.folds == {0: [2], 1: [5, 6]}
    assert lay.x == {4: 0.0, 1: 0.5, 3: 2.0, 0: 1.75} and lay.fold_x == {1: 1.0, 0: 3.0}
    root = parse(t.to_svg(max_nodes=4))
    assert [(g.get("data-parent"), g.get("data-count")) for g in groups(root, "fold")] == [
        ("0", "1"),
        ("1", "2"),
    ]
    with pytest.raises(ValueError, match="max_nodes"):
        keep_set(st, marks, 0)


def _no_overlap(lay) -> bool:
    rows: dict[int, list[float]] = {}
    for n, x in lay.x.items():
        rows.setdefault(lay.y[n], []).append(x)
    for n, x in lay.fold_x.items():
        rows.setdefault(lay.y[n] + 1, []).append(x)
    return all(b - a >= 1.0 for xs in rows.values() for a, b in zip(sorted(xs), sorted(xs)[1:]))


def test_500_nodes_fold_to_a_readable_view():
    t = big_tree(500)
    root = parse(t.to_svg())
    nodes, folds = groups(root, "node"), groups(root, "fold")
    assert len(t) == 500 and len(nodes) == 150
    assert len(nodes) + sum(int(f.get("data-count")) for f in folds) == 500
    shown = {int(g.get("data-id")) for g in nodes}
    solution = t.nodes_with(status="solution")[0]
    assert set(t.path(solution)) <= shown
    assert all(t.parent(n) in shown for n in shown if n != 0)
    st = structure(t.graph)
    lay = layout(st, shown)
    assert _no_overlap(lay)
    assert lay.columns <= 2 * 150 and int(root.get("width")) <= 2 * 150 * 54 + 40
    assert all(
        r.get("width") == "44" for g in nodes for r in g.iter(SVG + "rect") if r.get("rx") == "5"
    )  # full size
    full = layout(st, set(t.graph))  # no folding: still no overlap, just wider
    assert len(full.x) == 500 and _no_overlap(full)


TREES = hs.lists(
    hs.tuples(
        hs.integers(0, 10_000),
        hs.sampled_from(["expanded", "pruned", "frontier"]),
        hs.one_of(hs.none(), hs.floats(0, 20)),
    ),
    min_size=0,
    max_size=80,
)


@settings(max_examples=60, deadline=None)
@given(spec=TREES, max_nodes=hs.one_of(hs.none(), hs.integers(1, 30)))
def test_layout_invariants(spec, max_nodes):
    t = ThoughtTree()
    t.add_root("r")
    for i, (pick, status, score) in enumerate(spec):
        n = t.add_child(pick % (i + 1), f"t{i}", i)
        t.node(n).update(status=status, score=score)
    st = structure(t.graph)
    marks = node_marks(t.graph, t.meta, st)
    keep = keep_set(st, marks, max_nodes)
    lay = layout(st, keep)
    assert 0 in keep and all(st.parent[n] in keep for n in keep if n != 0)
    assert len(keep) <= (max_nodes or len(t))
    assert len(lay.x) + lay.folded == len(t)
    assert sorted(set(lay.x) | {h for v in lay.folds.values() for h in v}) == list(range(len(t)))
    assert _no_overlap(lay)
    for n in lay.x:
        xs = [lay.x[c] for c in st.children[n] if c in lay.x] + ([lay.fold_x[n]] if n in lay.fold_x else [])
        if xs:
            assert min(xs) <= lay.x[n] <= max(xs)


# -- colours ------------------------------------------------------------------------------------------
def test_score_colours():
    assert colour_at(0.0) == "#440154" and colour_at(1.0) == "#fde725" and colour_at(None) == "#d9d9d9"
    assert colour_at(0.5) == "#26828e"
    lin = ScoreScale(0.0, 10.0, False)
    assert (lin.t(0.0), lin.t(5.0), lin.t(10.0), lin.t(None)) == (0.0, 0.5, 1.0, None)
    log = ScoreScale(0.001, 20.0, True)
    assert log.t(0.001) == 0.0 and log.t(20.0) == 1.0 and abs(log.t(0.1414) - 0.5) < 1e-3
    marks = node_marks(marked_tree().graph)
    assert marks[4].fill == "#fde725" and marks[5].fill == "#440154"  # 20 is the max, 0.5 the min
    assert [short_score(s) for s in (None, 20.0, 4.0, 0.5, 0.001, 123.4)] == [
        "–",
        "20",
        "4.0",
        "0.50",
        "0.00",
        "123",
    ]


# -- KV map --------------------------------------------------------------------------------------------
def test_kv_map_of_the_hand_built_tree():
    m = kv_map(marked_tree())
    assert [(r.segment, r.tokens, r.nodes, r.contexts) for r in m.rows] == [
        (1, 10, [1, 2, 3, 4, 5], 4),
        (2, 5, [1, 4, 5], 3),
        (3, 5, [2, 3], 1),
        (4, 6, [4], 1),
        (5, 6, [5], 1),
    ]
    assert [r.evicted_nodes for r in m.rows] == [[5], [5], [], [], [5]]
    # contexts: (1,2)=15, (1,3)=15, (1,2,4)=21, (1,2,5)=21 -> 72 tokens over 32 distinct
    assert (m.contexts, m.context_tokens, m.distinct_tokens) == (4, 72, 32)
    assert (
        str(m).splitlines()[-1]
        == "4 contexts hold 72 tokens; the shared store holds 32 distinct tokens (2.25x)"
    )
    assert "<table" in m._repr_html_()
    assert repr(m) == "KVMap(5 segments, 4 contexts, 72 context tokens over 32 distinct)"


# -- files -------------------------------------------------------------------------------------------------
def test_html_page_is_standalone(tmp_path):
    t = marked_tree()
    path = t.to_html(tmp_path / "tree.html", title="hand tree")
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<title>hand tree</title>" in text
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert text.count('class="node ') == 7 and "<script" not in text
    assert "empty" in ThoughtTree()._repr_html_()


def test_node_link_and_graphml_round_trips(tmp_path):
    t = marked_tree()
    t.save(tmp_path / "a.json")
    back = ThoughtTree.load(tmp_path / "a.json")
    assert back.to_json() == t.to_json() and back.to_svg().count('class="node ') == 7
    t.to_node_link(tmp_path / "b.json")
    again = ThoughtTree.load(tmp_path / "b.json")
    assert again.to_json() == ThoughtTree.load(tmp_path / "b.json").to_json()
    assert {n: again.node(n).get("kv_chain") for n in again.graph} == {
        n: t.node(n).get("kv_chain") for n in t.graph
    }
    data = json.loads((tmp_path / "b.json").read_text())
    g = nx.node_link_graph(data, directed=True, edges="links")
    assert sorted(g.edges) == sorted(t.graph.edges) and g.edges[0, 3]["asks"] == 0.99
    t.to_graphml(tmp_path / "c.graphml")
    gm = nx.read_graphml(tmp_path / "c.graphml", node_type=int)
    assert sorted(gm.edges) == sorted(t.graph.edges)
    for n, d in t.graph.nodes(data=True):
        got = gm.nodes[n]
        assert (got["thought"], got["status"], got["depth"], got.get("score")) == (
            d["thought"],
            d["status"],
            d["depth"],
            d["score"],
        )
    assert json.loads(gm.nodes[4]["kv_chain"]) == [[1, 10], [2, 5], [4, 6]]
    assert gm.nodes[5]["evicted"] is True and gm.nodes[4]["cgee"] == "exit@12"
    assert gm.graph["problem"] == "hand"


def test_plot_draws_every_shown_node(tmp_path):
    from matplotlib.patches import FancyBboxPatch

    ax = marked_tree().plot()
    assert sum(isinstance(p, FancyBboxPatch) for p in ax.patches) == 7
    assert [t.get_text() for t in ax.texts][:2] == ["–", "4.0"]
    ax.figure.savefig(tmp_path / "t.png", dpi=80)
    assert (tmp_path / "t.png").stat().st_size > 5_000
    ax = big_tree(500).plot()
    assert sum(isinstance(p, FancyBboxPatch) for p in ax.patches) == 150
    import matplotlib.pyplot as plt

    plt.close("all")


# -- a real search (tiny model) -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def words(tiny_lm):
    return words_search(tiny_lm)


def test_live_kv_marks_survive_export(words, tmp_path):
    tree = words.tree
    live = node_marks(tree.graph)
    assert any(m.kv_tokens for m in live.values())
    for n, d in tree.graph.nodes(data=True):  # live chains come from the kv handles
        if d["kv"] is not None:
            seg, used = d["kv"]
            assert live[n].kv_tokens == sum(u for _, u in seg.context_chain(used))
    tree.to_node_link(tmp_path / "w.json")
    back = ThoughtTree.load(tmp_path / "w.json")
    saved = node_marks(back.graph)
    fields = ("kv_tokens", "kv_shared", "kv_segments", "evicted", "status", "score", "fill")
    assert {n: tuple(getattr(m, f) for f in fields) for n, m in saved.items()} == {
        n: tuple(getattr(m, f) for f in fields) for n, m in live.items()
    }
    assert str(back.kv_map()) == str(tree.kv_map())
    assert back.to_svg().count('class="node ') == len(tree) == words.tree.to_svg().count('class="node ')


# -- thoughts written on the nodes, and the legend of what occurs ------------------------------------------
def cards(svg: str) -> dict[int, list[str]]:
    """node id -> the lines of its thought card (the <tspan>s of its <text class="thought">)."""
    out = {}
    for g in groups(parse(svg), "node"):
        texts = [t for t in g.iter(SVG + "text") if t.get("class") == "thought"]
        out[int(g.get("data-id"))] = [s.text for t in texts for s in t.iter(SVG + "tspan")]
    return out


def test_each_thought_is_written_on_its_node_in_wrapped_lines():
    t = marked_tree()
    t.node(4)["thought"] = "(3 * 7) * (14 + 1) = 315 (left: 315 14)"
    t.node(5)["thought"] = "x" * 30
    assert cards(t.to_svg()) == {
        0: ["input: x"],  # the root: the search's input
        1: ["one"],
        2: ["two"],
        3: ["three"],
        4: ["(3 * 7) * (14 + 1) =", "315 (left: 315 14)"],  # 22 characters a line, at spaces
        5: ["x" * 22, "x" * 8],  # a long word is broken
        6: ["six"],
    }
    t.node(6)["thought"] = " ".join(f"w{i:02d}" for i in range(60))  # 239 characters: cut at 8 lines
    lines = cards(t.to_svg())[6]
    assert len(lines) == 8 and lines[:2] == ["w00 w01 w02 w03 w04", "w05 w06 w07 w08 w09"]
    assert lines[-1] == "w35 w36 w37 w38 w39…"  # lines 9 to 12 are cut; the hover text holds them


def test_exact_svg_of_a_two_node_tree():
    t = ThoughtTree()
    t.meta["input"] = "4 5 6 10"
    t.add_root("4 5 6 10")
    t.set_status(0, "expanded")
    c = t.add_child(0, "4 + 5 = 9 (left: 6 9 10)", "6 9 10")
    t.node(c)["score"] = 1.0
    svg = re.sub(r"ts\d+-ev", "tsN-ev", t.to_svg())
    mono = "DejaVu Sans Mono, Menlo, Consolas, monospace"
    assert svg == (
        '<svg xmlns="http://www.w3.org/2000/svg" class="treesearch-tree" width="190" height="208" '
        'viewBox="0 0 190 208" font-family="Helvetica, Arial, sans-serif" font-size="11" data-nodes="2" '
        'data-shown="2" data-folded="0" role="img" aria-label="thought tree with 2 nodes">'
        '<defs><pattern id="tsN-ev" width="4" height="4" patternUnits="userSpaceOnUse">'
        '<path d="M0,4 L4,0" stroke="#d62728" stroke-width="1"/></pattern></defs>'
        '<g class="edges" fill="none">'
        '<path d="M95.0,74.0 C95.0,100.0 95.0,100.0 95.0,126.0" stroke="#9a9a9a" stroke-width="1.2"/></g>'
        '<g class="node status-expanded" data-id="0" data-status="expanded" opacity="1.0"><title>'
        "#0 · depth 0 · expanded\nthought: (root)\nstate: 4 5 6 10\nscore: not evaluated</title>"
        '<rect x="73.0" y="26.0" width="44" height="22" rx="5" fill="#d9d9d9" stroke="#333333" '
        'stroke-width="1"/><text x="95.0" y="41.0" text-anchor="middle" fill="#111111">–</text>'
        '<rect class="thought-card" x="25.0" y="56.0" width="140" height="18" rx="3" fill="#ffffff" '
        f'stroke="#c8c8c8" stroke-width="0.8"/><text class="thought" font-family="{mono}" font-size="10" '
        'fill="#1a1a1a"><tspan x="30.0" y="69.0">input: 4 5 6 10</tspan></text></g>'
        '<g class="node status-frontier" data-id="1" data-status="frontier" opacity="1.0"><title>'
        "#1 · depth 1 · frontier\nthought: 4 + 5 = 9 (left: 6 9 10)\nstate: 6 9 10\nscore: 1</title>"
        '<rect x="73.0" y="126.0" width="44" height="22" rx="5" fill="#26828e" stroke="#2563eb" '
        'stroke-width="1" stroke-dasharray="3 2"/>'
        '<text x="95.0" y="141.0" text-anchor="middle" fill="#ffffff">1.0</text>'
        '<rect class="thought-card" x="25.0" y="156.0" width="140" height="30" rx="3" fill="#ffffff" '
        f'stroke="#c8c8c8" stroke-width="0.8"/><text class="thought" font-family="{mono}" font-size="10" '
        'fill="#1a1a1a"><tspan x="30.0" y="169.0">4 + 5 = 9 (left: 6 9</tspan>'
        '<tspan x="30.0" y="181.0">10)</tspan></text></g></svg>'
    )


def legend_marks(tree, **kw) -> list[str]:
    """The legend's entries, by the class of the text that names each."""
    root = parse(legend_svg(tree, **kw))
    return [t.get("class")[5:] for t in root.iter(SVG + "text") if (t.get("class") or "").startswith("mark-")]


def test_the_legend_lists_only_the_marks_the_drawing_shows():
    t = marked_tree()
    assert legend_marks(t) == ["score", "solution", "pruned", "frontier", "kv", "evicted", "cgee", "asks"]
    cgee = [x.text for x in parse(legend_svg(t)).iter(SVG + "text") if x.get("fill") == "#2563eb"]
    assert cgee == ["skip L12"]
    # folded to 4 nodes: 2 (skip) and 5 (evicted) are hidden, a fold marker appears
    assert legend_marks(t, max_nodes=4) == ["score", "solution", "frontier", "kv", "cgee", "asks", "folded"]
    assert [
        x.text for x in parse(legend_svg(t, max_nodes=4)).iter(SVG + "text") if x.get("fill") == "#2563eb"
    ] == ["L12"]
    plain = ThoughtTree()
    plain.add_root("r")
    plain.set_status(0, "expanded")
    for s in (1.0, 2.0):
        plain.node(plain.add_child(0, f"t{s}", s))["score"] = s
    assert legend_marks(plain) == ["score", "frontier"]
    text = legend_svg(plain)
    for absent in ("evicted", "CGEE", "ASKS", "folded", "KV shared", "solution", "pruned"):
        assert absent not in text
    assert legend_marks(ThoughtTree()) == []


def test_large_drawings_keep_compact_boxes_and_say_how_to_see_the_thoughts():
    t = big_tree(500)
    assert 'class="thought"' not in t.to_svg()  # 150 nodes drawn: compact
    assert "pass max_nodes=100 or labels=True" in t._repr_html_()
    assert len(cards(t.to_svg(max_nodes=100))) == 100
    assert all(lines for lines in cards(t.to_svg(max_nodes=100)).values())
    assert sum(bool(v) for v in cards(t.to_svg(labels=True)).values()) == 150
    assert cards(marked_tree().to_svg(labels=False)) == {n: [] for n in range(7)}
    assert "hover a node for its state, score and marks" in marked_tree()._repr_html_()


def test_plot_writes_wrapped_thoughts_under_the_boxes():
    t = marked_tree()
    t.node(4)["thought"] = "(3 * 7) * (14 + 1) = 315 (left: 315 14)"
    ax = t.plot()
    texts = [x.get_text() for x in ax.texts]
    assert "(3 * 7) * (14 + 1)\n= 315 (left: 315\n14)" in texts  # 18 characters a line
    assert {"one", "two", "three", "five", "six"} <= set(texts)
    import matplotlib.pyplot as plt

    plt.close("all")
