"""ASKS: the gate's arithmetic, row pairing, and what attaching does in the engine (tiny model)."""

from __future__ import annotations

import math

import pytest
import torch

from treesearch.common.config import RKSCConfig
from treesearch.engine.local import Engine
from treesearch.policies import asks

TEMPLATE = (
    "Can the numbers reach 24? Judge sure, likely or impossible.\nNumbers: 10 14\nJudgement: sure\n"
    "Numbers: 11 12\nJudgement: impossible\nNumbers: "
)
LABELS = [" sure", " likely", " impossible"]
NUMBERS = ["4 5 6", "4 6 6", "2 5 6", "3 3 8"]


def test_sigma_is_one_for_identical_states_and_a_weighted_mean_of_cosines():
    h = torch.randn(4, 8)
    assert asks.sigma(h, h.clone(), alpha=2.0) == 1.0
    w = [math.exp(2.0 * lv / 4) for lv in (1, 2, 3, 4)]
    assert asks.layer_weights(4, 2.0).tolist() == pytest.approx(w)
    a = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    b = torch.tensor([[0.0, 1.0], [1.0, 0.0]])  # layer 1 orthogonal, layer 2 identical
    w1, w2 = math.exp(1.0 / 2), math.exp(2.0 / 2)
    assert asks.sigma(a, b, alpha=1.0) == pytest.approx(w2 / (w1 + w2))
    assert asks.sigma(a, b, alpha=0.0) == pytest.approx(0.5)


def test_pair_rows_needs_equal_lengths_a_common_suffix_and_uncached_spans():
    ids = [
        [1, 2, 3, 7, 8],  # 0: a reference
        [1, 2, 4, 7, 8],  # 1: differs at position 2, suffix [7 8] -> attaches to 0
        [1, 2, 3, 7, 8],  # 2: identical to 0: the exact path, never paired
        [1, 2, 4, 9, 8],  # 3: suffix of 1 token only -> a reference itself
        [1, 5, 5, 9, 8],  # 4: suffix [9 8] with row 3 -> attaches to 3
        [1, 2, 4, 7],  # 5: other length -> a reference
    ]
    pairs = asks.pair_rows(ids, matched=[0] * len(ids))
    assert pairs == [asks.Pair(row=1, ref=0, prefix=2, suffix=2), asks.Pair(row=4, ref=3, prefix=1, suffix=2)]
    # a row whose span is already cached (matched reaches the suffix) is not paired
    assert asks.pair_rows(ids[:2], matched=[0, 3]) == []


def _prompts():
    return [TEMPLATE + n + "\nJudgement:" for n in NUMBERS]


def _engines(tiny_lm, tau):
    ex = Engine(tiny_lm, RKSCConfig(kv_sharing="exact"))
    ak = Engine(tiny_lm, RKSCConfig(kv_sharing="asks", asks_tau=tau))
    for e in (ex, ak):
        e.score([TEMPLATE], LABELS)  # the template is cached, as in a search
    return ex, ak


def test_closed_gate_is_lossless_and_logs_every_decision(tiny_lm):
    ex, ak = _engines(tiny_lm, tau=1.5)  # sigma <= 1 < tau: nothing attaches
    a, b = ex.score(_prompts(), LABELS), ak.score(_prompts(), LABELS)
    for x, y in zip(a, b):
        assert all(abs(x.probs[k] - y.probs[k]) <= 1e-4 for k in LABELS)
        assert y.asks_ref is None
    assert ak.stats.asks_attached == 0 and ak.stats.asks_extra_reused == 0
    assert [d["attached"] for d in ak.asks_log] == [False] * len(ak.asks_log) and len(ak.asks_log) == 3
    assert [r.asks_sigma is None for r in b] == [True, False, False, False]
    ak.store.check_invariants()


def test_open_gate_attaches_to_the_reference_suffix_kv_and_counts_it(tiny_lm):
    ex, ak = _engines(tiny_lm, tau=-1.0)  # every pair attaches
    prompts = _prompts()
    a, b = ex.score(prompts, LABELS), ak.score(prompts, LABELS)
    ids = [ak.tokenize(p) for p in prompts]
    pairs = asks.pair_rows(ids, [len(ak.tokenize(TEMPLATE))] * len(ids))
    assert [(p.row, p.ref) for p in pairs] == [(1, 0), (2, 0), (3, 0)]
    assert [y.asks_ref for y in b] == [None, 0, 0, 0]
    extra = sum(len(ids[p.row]) - 1 - (len(ids[p.row]) - p.suffix) for p in pairs)
    assert ak.stats.asks_attached == 3 and ak.stats.asks_extra_reused == extra
    assert ak.stats.prefill_tokens == ex.stats.prefill_tokens - extra
    # the reference is computed exactly; attached rows hold the reference's suffix K/V
    assert all(abs(a[0].probs[k] - b[0].probs[k]) <= 1e-4 for k in LABELS)
    ref_chain = {c.id: c for c, _ in b[0].handle[0].context_chain()}
    for p in pairs:
        attached = [s for s, _ in b[p.row].handle[0].context_chain() if s.id in ak.asks.refs]
        assert len(attached) == 1 and len(attached[0]) == p.suffix - 1
        s = attached[0]
        src = ref_chain[ak.asks.refs[s.id]]
        off = s.start - src.start
        assert torch.equal(s.kv, src.kv[:, :, :, off : off + len(s)])
    ak.store.check_invariants()


def test_identical_prompts_take_the_exact_path(tiny_lm):
    ex, ak = _engines(tiny_lm, tau=-1.0)
    prompts = [TEMPLATE + "4 5 6\nJudgement:"] * 3
    a, b = ex.score(prompts, LABELS), ak.score(prompts, LABELS)
    assert ak.asks_log == [] and ak.stats.asks_attached == 0
    for x, y in zip(a, b):
        assert all(abs(x.probs[k] - y.probs[k]) <= 1e-4 for k in LABELS)


def test_search_records_attachments_on_the_tree(tiny_lm):
    from test_rsbcm import Plan

    from strategies import BFS
    from treesearch.search.searcher import Searcher

    s = Searcher(
        tiny_lm, Plan(), BFS(breadth=3), RKSCConfig(kv_sharing="asks", asks_tau=-1.0), progress=False, seed=3
    )
    r = s.solve(" start")
    marked = {
        n: r.tree.node(n)["asks_value"]["ref"] for n in r.tree.graph if r.tree.node(n).get("asks_value")
    }
    # value prompts of equal length with a common suffix attach to an earlier node of the same step
    assert marked == {6: 5, 9: 8}
    assert r.stats["asks_attached"] == 2 and r.stats["asks_extra_reused"] == 8
    assert all(r.tree.node(n)["depth"] == r.tree.node(ref)["depth"] for n, ref in marked.items())
