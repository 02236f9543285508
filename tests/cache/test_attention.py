"""Shared-prefix attention is lossless: rows attending over a cached prefix in place (one copy of
its K/V for the whole batch) give what unshared computation gives (tiny model, fp32: identical
tokens, log-probabilities and label probabilities within 1e-4), for batch sizes 1, 2, 7 and
prefixes of 0, 1, 15, 16, 17 and 300 tokens (around one 16-token block and well past it)."""

from __future__ import annotations

import pytest

from treesearch.common.config import RKSCConfig, Sampling
from treesearch.engine.local import Engine

WORDS = " the cat sat on a mat and then it ran to big red house with one old dog".split()
LABELS = [" yes", " no"]
SAMPLING = Sampling(max_new_tokens=5)


def prefix_of(n: int) -> str:
    return "".join(f" {WORDS[i % len(WORDS)]}" for i in range(n))


def prompts_for(prefix: str, batch: int) -> list[str]:
    # suffixes of different lengths: row b adds b extra words
    return [
        prefix + f" Row {b}:" + "".join(f" {WORDS[(b + i) % len(WORDS)]}" for i in range(b))
        for b in range(batch)
    ]


@pytest.mark.parametrize("batch", [1, 2, 7])
@pytest.mark.parametrize("plen", [0, 1, 15, 16, 17, 300])
def test_shared_prefix_attention_equals_unshared(tiny_lm, plen, batch):
    prefix = prefix_of(plen)
    exact = Engine(tiny_lm, RKSCConfig(kv_sharing="exact"))
    assert len(exact.tokenize(prefix)) == plen  # each word is one token
    if plen:
        exact.score([prefix], LABELS)  # cache the prefix: the batch below reads it in place
    prompts = prompts_for(prefix, batch)
    off = Engine(tiny_lm, RKSCConfig(kv_sharing="off"))
    g_exact, g_off = exact.generate(prompts, SAMPLING), off.generate(prompts, SAMPLING)
    for a, b in zip(g_exact, g_off):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-4
    s_exact, s_off = exact.score(prompts, LABELS), off.score(prompts, LABELS)
    for a, b in zip(s_exact, s_off):
        assert all(abs(a.probs[k] - b.probs[k]) <= 1e-4 for k in LABELS)
    if plen:
        assert all(g.reused_tokens >= plen for g in g_exact)
        firsts = {id(g.handle[0].context_chain()[0][0]) for g in g_exact}
        assert len(firsts) == 1  # every row's context starts in the same stored prefix segment
    # every distinct token position of every context is stored exactly once
    assert sum(len(s) for s in exact.store.segments.values()) == exact.stats.unique_tokens
    exact.store.check_invariants()
