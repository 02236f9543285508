"""Labels scored as whole token sequences: P(label | prompt) = prod_j p(t_j | prompt, t_<j),
renormalised over the labels; labels of one token score exactly as a first-token read."""

from __future__ import annotations

import pytest
import torch

from treesearch import Engine, ProblemDefinitionError, RKSCConfig
from treesearch.engine.labels import label_sequences

PROMPTS = ["Is the sky blue? Answer:", "Can a fish climb a tree? Answer:", "Is 2 + 2 = 4? Answer:"]


def reference_logp(lm, prompt: str, label_ids: list[int]) -> float:
    """log P(label tokens | prompt) from plain transformers over the whole text, no cache."""
    ids = lm.tokenizer.encode(prompt, add_special_tokens=False)
    full = torch.tensor([ids + label_ids])
    with torch.no_grad():
        logits = lm.model(full).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return float(sum(logp[len(ids) - 1 + j, t] for j, t in enumerate(label_ids)))


def reference(lm, prompt: str, labels: list[str]) -> dict[str, float]:
    seqs = label_sequences(lm.tokenizer, labels)
    raw = {lab: torch.tensor(reference_logp(lm, prompt, q)).exp().item() for lab, q in zip(labels, seqs)}
    tot = sum(raw.values())
    return {k: v / tot for k, v in raw.items()}


@pytest.mark.parametrize("kv", ["off", "exact"])
def test_labels_that_share_their_first_token_are_told_apart_by_their_whole_sequence(tiny_lm, kv):
    labels = [" yes indeed", " yes but no", " no"]
    seqs = label_sequences(tiny_lm.tokenizer, labels)
    assert seqs[0][0] == seqs[1][0] and seqs[0] != seqs[1]  # the same first token
    eng = Engine(tiny_lm, RKSCConfig(kv_sharing=kv))
    for _ in range(2):  # the second time the prompts come from the cache
        scores = eng.score(PROMPTS, labels)
        for prompt, s in zip(PROMPTS, scores):
            ref = reference(tiny_lm, prompt, labels)
            assert s.probs == pytest.approx(ref, abs=1e-4)
            assert s.probs[" yes indeed"] != pytest.approx(s.probs[" yes but no"], abs=1e-6)
            assert sum(s.probs.values()) == pytest.approx(1.0)


def test_single_token_labels_score_as_their_first_token(tiny_lm):
    labels = [" yes", " no"]
    eng = Engine(tiny_lm, RKSCConfig())
    ids = [q[0] for q in label_sequences(tiny_lm.tokenizer, labels)]
    for prompt, s in zip(PROMPTS, eng.score(PROMPTS, labels)):
        toks = torch.tensor([tiny_lm.tokenizer.encode(prompt, add_special_tokens=False)])
        with torch.no_grad():
            p = torch.softmax(tiny_lm.model(toks).logits[0, -1].float(), dim=-1)
        raw = {lab: float(p[i]) for lab, i in zip(labels, ids)}
        assert s.raw == pytest.approx(raw, abs=1e-6)
    assert eng.stats.model_calls == 1  # one forward: no tail pass for one-token labels


def test_a_multi_token_label_under_a_budget_and_in_a_search_scores_the_same(tiny_lm):
    from reliability_problems import Words

    from strategies import BFS
    from treesearch import Searcher

    class LongLabels(Words):
        labels = {" yes it is": 1.0, " yes it might": 0.5, " no": 0.0}

    problem = LongLabels(width=2, depth=2, max_new_tokens=4)
    full = Searcher(tiny_lm, problem, BFS(breadth=2), RKSCConfig(), progress=False).solve("cats")
    off = Searcher(tiny_lm, problem, BFS(breadth=2), RKSCConfig(kv_sharing="off"), progress=False).solve(
        "cats"
    )
    peak = full.stats["peak_kv_bytes"]
    tight = Searcher(
        tiny_lm, problem, BFS(breadth=2), RKSCConfig(cache_budget=peak // 2), progress=False
    ).solve("cats")
    for other in (off, tight):
        assert sorted(other.tree.graph) == sorted(full.tree.graph)
        for n in full.tree.graph:
            a, b = full.tree.node(n), other.tree.node(n)
            assert a["thought"] == b["thought"]
            assert (a["score"] is None and b["score"] is None) or abs(a["score"] - b["score"]) <= 1e-4
    assert tight.stats["peak_kv_bytes"] <= peak // 2


def test_labels_alike_or_empty_are_refused_naming_the_fix(tiny_lm):
    eng = Engine(tiny_lm)
    with pytest.raises(ProblemDefinitionError, match="tokenize alike"):
        eng.score(PROMPTS[:1], [" yes", " yes"])
    with pytest.raises(ProblemDefinitionError, match="tokenizes to nothing"):
        eng.score(PROMPTS[:1], [" yes", ""])
