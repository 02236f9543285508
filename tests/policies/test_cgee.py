"""CGEE: the exit rule and the skip rule on hand-made inputs, per-row exit in the engine (a
cut-short row stores no K/V and leaves the shared cache unchanged), and the Searcher's CGEE path
(skip, exit, measurement mode, counters) on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.common.config import RKSCConfig, Sampling
from treesearch.core.problem import Child, Problem
from treesearch.engine.local import Engine
from treesearch.policies.cgee import (
    LayerExit,
    Thresholds,
    confidence_value,
    decisive_branch,
    exit_layer,
    label_entropy,
    load_thresholds,
)
from treesearch.search.verifier import LayerRecorder

LABELS = [" sure", " likely", " impossible"]


def _dist(h_target: float) -> list[float]:
    """A 2-label distribution [p, 1-p] with entropy h_target nats (0 <= h < ln 2), p >= 1/2."""
    lo, hi = 0.5, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        h = -(mid * math.log(mid) + (1 - mid) * math.log(1 - mid)) if mid < 1 else 0.0
        lo, hi = (mid, hi) if h > h_target else (lo, mid)
    return [lo, 1 - lo]


# -- Level 2: the exit rule ---------------------------------------------------------------------
def test_exit_layer_exact_on_hand_made_entropies():
    #        layer:  1    2    3    4     5      6     7
    h = [0.60, 0.50, 0.30, 0.05, 0.045, 0.044, 0.01]
    # layer 5 is the first with H < 0.1 and |dH| < 0.01 (layer 4 moved by 0.25)
    assert exit_layer(h, theta=0.1, eps=0.01, min_layer=2) == 5
    assert exit_layer(h, theta=0.1, eps=0.01, min_layer=6) == 6
    assert exit_layer(h, theta=0.1, eps=0.0005, min_layer=2) is None  # 0.001 steps are still too large
    assert exit_layer(h, theta=0.02, eps=0.05, min_layer=2) == 7


def test_exit_layer_never_before_min_layer():
    h = [0.0] * 10  # settled from the start
    for m in range(1, 11):
        assert exit_layer(h, theta=0.1, eps=0.01, min_layer=m) == max(m, 2)


def test_exit_layer_never_exits_while_entropy_moves():
    h = [0.05 if i % 2 else 0.02 for i in range(30)]  # low but swinging by 0.03 every layer
    assert exit_layer(h, theta=0.1, eps=0.02, min_layer=2) is None


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.0, 0.69), min_size=3, max_size=12),
    st.floats(0.0, 0.7),
    st.floats(0.0, 0.3),
    st.integers(1, 12),
)
def test_layer_exit_rule_matches_exit_layer_per_row(hs, theta, eps, m):
    """The engine-facing rule, fed the rows still alive, stops each row where exit_layer says."""
    rows = [hs, hs[::-1], [0.0] * len(hs)]
    rule = LayerExit(Thresholds(theta=theta, eps=eps, min_layer=m))
    alive = list(range(len(rows)))
    stopped = {}
    for layer in range(1, len(hs)):  # the engine never asks after the last layer
        probs = torch.tensor([_dist(rows[r][layer - 1]) for r in alive])
        stop = rule(layer, probs).tolist()
        stopped.update({r: layer for r, s in zip(alive, stop) if s})
        alive = [r for r, s in zip(alive, stop) if not s]
        if not alive:
            break
    for r, h in enumerate(rows):
        ent = [float(label_entropy(torch.tensor([_dist(x)]))[0]) for x in h]
        want = exit_layer(ent[:-1], theta, eps, m)  # exits are only possible before the last layer
        assert stopped.get(r) == want


# -- Level 1: the skip rule ---------------------------------------------------------------------
def test_skip_when_decisive():
    assert decisive_branch([0.40, 0.97, 0.80], tau_conf=0.95, margin=0.1) == 1


def test_no_skip_below_tau_or_margin():
    assert decisive_branch([0.40, 0.94, 0.20], tau_conf=0.95, margin=0.1) is None  # best below tau
    assert decisive_branch([0.90, 0.97, 0.20], tau_conf=0.95, margin=0.1) is None  # lead 0.07 < margin


def test_no_skip_on_tie_even_with_zero_margin():
    # children parsed from ONE generation share its confidence: never decisive
    assert decisive_branch([0.99, 0.99, 0.99], tau_conf=0.5, margin=0.0) is None
    assert decisive_branch([0.99, 0.99, 0.10], tau_conf=0.5, margin=0.0) is None


def test_single_branch_and_empty_set():
    assert decisive_branch([0.96], tau_conf=0.95, margin=0.1) == 0
    assert decisive_branch([0.90], tau_conf=0.95, margin=0.1) is None
    assert decisive_branch([], tau_conf=0.0, margin=0.0) is None


def test_confidence_value_on_the_label_scale():
    w = {" sure": 20.0, " likely": 1.0, " impossible": 0.001}
    assert confidence_value(1.0, w) == 20.0
    assert confidence_value(0.0, w) == 0.001
    assert confidence_value(0.5, w) == pytest.approx(0.001 + 0.5 * 19.999)


def test_shipped_calibration_loads():
    t = load_thresholds("SmolLM2-135M-Instruct", "game24")
    assert t is not None and 2 <= t.min_layer <= 30


# -- the engine: per-row exit ------------------------------------------------------------------
def _snapshot(store) -> list:
    out, todo = [], [store.root]
    while todo:
        s = todo.pop()
        kv = None if s.kv is None else (tuple(s.kv.shape), float(s.kv.double().sum()))
        out.append((s.id, s.tokens, s.parent_len, kv))
        todo.extend(s.children.values())
    return sorted(out, key=lambda x: x[0]) + [store.bytes_held]


PROMPTS = [f"Numbers: {i} {i + 1} {i + 3}\nJudgement:" for i in range(5)]


class _Plan:
    """Stops original rows at given layers (a per-row rule with a known outcome)."""

    def __init__(self, plan: dict[int, int], n: int) -> None:
        self.plan, self.n = plan, n

    def __call__(self, layer, probs):
        if layer == 1:
            self.alive = list(range(self.n))
        stop = [self.plan.get(r) == layer for r in self.alive]
        self.alive = [r for r, s in zip(self.alive, stop) if not s]
        return torch.tensor(stop)


def test_per_row_exit_probs_and_no_partial_kv(tiny_lm):
    full_engine = Engine(tiny_lm, RKSCConfig())
    rec = LayerRecorder()
    full = full_engine.score(PROMPTS, LABELS, exit_rule=rec)
    traj = rec.rows()
    engine = Engine(tiny_lm, RKSCConfig())
    engine.score(["Numbers: 1 2"], LABELS)  # something in the shared cache beforehand
    before = _snapshot(engine.store)
    plan = {0: 2, 2: 2, 4: 3}
    out = engine.score(PROMPTS, LABELS, exit_rule=_Plan(plan, len(PROMPTS)))
    assert [s.layers_run for s in out] == [2, 4, 2, 4, 3]
    for r, s in enumerate(out):
        if r in plan:
            assert s.handle is None
            assert [s.probs[k] for k in LABELS] == pytest.approx(traj[r][plan[r] - 1], abs=1e-6)
        else:
            assert s.handle is not None
            assert [s.probs[k] for k in LABELS] == pytest.approx([full[r].probs[k] for k in LABELS], abs=1e-5)
    # only the two full rows added K/V: rerun them alone in a fresh engine and compare stores
    ref = Engine(tiny_lm, RKSCConfig())
    ref.score(["Numbers: 1 2"], LABELS)
    ref.score([PROMPTS[1], PROMPTS[3]], LABELS)
    assert engine.store.bytes_held == ref.store.bytes_held
    assert sorted(x[1] for x in _snapshot(engine.store)[:-1]) == sorted(
        x[1] for x in _snapshot(ref.store)[:-1]
    )
    assert before != _snapshot(engine.store)


def test_cut_short_pass_leaves_the_shared_cache_unchanged(tiny_lm):
    engine = Engine(tiny_lm, RKSCConfig())
    engine.score(PROMPTS[:2], LABELS)
    before = _snapshot(engine.store)
    out = engine.score(PROMPTS, LABELS, exit_rule=LayerExit(Thresholds(theta=10.0, eps=10.0, min_layer=2)))
    assert [s.layers_run for s in out] == [2] * 5
    assert all(s.handle is None for s in out)
    assert _snapshot(engine.store) == before
    out = engine.score(PROMPTS, LABELS, exit_rule=lambda layer, probs: layer == 3)  # whole-batch exit
    assert [s.layers_run for s in out] == [3] * 5
    assert _snapshot(engine.store) == before


# -- the Searcher's CGEE path ------------------------------------------------------------------
class Branchy(Problem):
    """Three sampled generations per node, one child each (so siblings carry distinct confidences)."""

    name = "branchy"
    labels = {" sure": 20.0, " likely": 1.0, " impossible": 0.001}
    value_range = (0.0, 20.0)
    max_depth = 2
    samples_per_expand = 3
    sampling = Sampling(max_new_tokens=3, temperature=1.0)

    def expand_prompt(self, state):
        return f"Numbers: {state}\nMove:"

    def parse_children(self, state, text):
        return [Child(thought=text, state=f"{state}|{len(text) % 7}{text[:4]!r}")]

    def value_prompt(self, state):
        return f"Numbers: {state}\nJudgement:"


def _search(lm, **cfg):
    from strategies import BFS
    from treesearch.search.searcher import Searcher

    config = RKSCConfig(**cfg)
    s = Searcher(lm, Branchy(), BFS(breadth=2), config, progress=False)
    return s.solve("1 2 3")


def test_searcher_skips_decisive_sets(tiny_lm):
    res = _search(tiny_lm, cgee=True, tau_conf=0.0, margin=0.0, theta=0.0, eps=0.0, min_layer=4)
    tree = res.tree
    lm_nodes = [n for n in tree.graph.nodes if n != 0]
    assert lm_nodes and all(tree.node(n)["cgee"] == "skipped" for n in lm_nodes)
    w = Branchy.labels
    for n in lm_nodes:
        assert tree.node(n)["score"] == pytest.approx(confidence_value(tree.node(n)["confidence"], w))
    st = res.stats
    assert st["verify_skipped"] == st["verify_calls"] > 0
    assert st["verify_layers_run"] == st["verify_layers_full"] == 0


def test_searcher_exit_counts_layers(tiny_lm):
    res = _search(tiny_lm, cgee=True, tau_conf=2.0, theta=10.0, eps=10.0, min_layer=3)
    st = res.stats
    assert st["verify_skipped"] == 0
    assert st["verify_layers_run"] == 3 * st["verify_calls"]
    assert st["verify_layers_full"] == tiny_lm.num_layers * st["verify_calls"]
    assert {res.tree.node(n)["cgee"] for n in res.tree.graph.nodes if n != 0} == {"exit@3"}


def test_measurement_mode_keeps_the_tree_and_counts_disagreements(tiny_lm):
    off = _search(tiny_lm)
    measured = _search(tiny_lm, cgee_measure=True, tau_conf=2.0, theta=10.0, eps=10.0, min_layer=2)
    t0, t1 = off.tree, measured.tree
    assert sorted(t0.graph.nodes) == sorted(t1.graph.nodes)
    for n in t0.graph.nodes:
        assert t1.node(n)["score"] == pytest.approx(t0.node(n)["score"], abs=1e-4)
        assert t1.node(n)["status"] == t0.node(n)["status"]
    # every row exits at layer 2: a disagreement is a prompt whose layer-2 label argmax differs
    prompts = sorted({Branchy().value_prompt(t0.node(n)["state"]) for n in t0.graph.nodes if n != 0})
    rec = LayerRecorder()
    full = Engine(tiny_lm, RKSCConfig()).score(prompts, LABELS, exit_rule=rec)
    want = sum(
        max(range(3), key=lambda k: tr[1][k]) != max(range(3), key=lambda k: s.probs[LABELS[k]])
        for tr, s in zip(rec.rows(), full)
    )
    assert measured.stats["cgee_disagreements"] == want
    assert measured.stats["verify_calls"] == off.stats["verify_calls"] == len(prompts)
