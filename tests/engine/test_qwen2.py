"""The local engine on Qwen2 (q/k/v biases, RoPE base 1e6, an LM head of its own or tied), on a tiny
random Qwen2: the fast decode step equals the layer path (every step's logits within 1e-4, identical
greedy tokens) over every kind of prefix group, exact sharing equals sharing off (tokens identical,
scores within 1e-4), and a BFS search gives the same tree with sharing on and off."""

from __future__ import annotations

import pytest
import torch
from same_results import assert_same as assert_same_search
from test_decoder import assert_same, decode_both, words
from test_lossless import _assert_same as assert_lossless
from test_lossless import _run_both as run_both_modes

from strategies import BFS
from treesearch import RKSCConfig, Sampling, Searcher
from treesearch.engine import decoder
from treesearch.engine.local import Engine
from treesearch.models.load import TINY_QWEN2, load_model, tiny_model


@pytest.fixture(scope="module", params=[False, True], ids=["own-lm-head", "tied-lm-head"])
def qwen_lm(request):
    return tiny_model(seed=0, arch="qwen2", tied=request.param)


def test_the_tiny_qwen2_is_built_as_qwen2_is_and_qualifies(qwen_lm):
    model, cfg = qwen_lm.model, qwen_lm.model.config
    assert cfg.model_type == "qwen2" and type(model).__name__ == "Qwen2ForCausalLM"
    att = model.model.layers[0].self_attn
    for proj in (att.q_proj, att.k_proj, att.v_proj):
        assert proj.bias is not None and float(proj.bias.detach().abs().min()) > 0  # drawn, not left at zero
    assert att.o_proj.bias is None
    d = qwen_lm.head_dim
    expected = 1.0 / (1e6 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    assert torch.allclose(model.model.rotary_emb.inv_freq, expected)
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tied is bool(cfg.tie_word_embeddings)
    assert decoder.qualifies(model)
    assert Engine(qwen_lm).forward.decoder is decoder.decoder_for(model)


def test_load_model_builds_the_tiny_qwen2_by_name():
    lm = load_model(TINY_QWEN2)
    assert lm.name == TINY_QWEN2 and lm.model.config.model_type == "qwen2"


@pytest.mark.parametrize("pack", [True, False], ids=["own-runs-packed", "own-runs-in-place"])
@pytest.mark.parametrize("batch", [1, 4])
def test_fast_step_equals_layer_path_over_every_kind_of_prefix_group(qwen_lm, batch, pack, monkeypatch):
    if not pack:
        monkeypatch.setattr(decoder, "PACK_SINGLES_BYTES", 0)
    base, more = words(20), words(9, 5)
    prompts = [
        base + more + f" Row {b}:" + words(b, b) if b < 2 else base + f" Row {b}:" + words(b, b)
        for b in range(batch)
    ]
    out = decode_both(
        qwen_lm, prompts, [base, base + more, prompts[0]], Sampling(max_new_tokens=10, ignore_eos=True)
    )
    assert_same(out)


def test_the_fast_step_without_the_biases_is_not_the_layer_path(qwen_lm):
    """The comparison above can fail: the same step with q/k/v biases dropped from the packed
    weights gives other logits (so the biases are what makes it equal)."""
    prompts = [words(12) + " Row:"]
    eng = Engine(qwen_lm, RKSCConfig(kv_sharing="off", fast_decode=True))
    layers = Engine(qwen_lm, RKSCConfig(kv_sharing="off", fast_decode=False))
    unbiased = decoder.Decoder(qwen_lm.model)
    for layer in unbiased.layers:
        layer.qkv.bias = None
    eng.forward.decoder = unbiased
    sampling = Sampling(max_new_tokens=6, ignore_eos=True)
    a, b = eng.generate(prompts, sampling)[0], layers.generate(prompts, sampling)[0]
    assert max(abs(x - y) for x, y in zip(a.logprobs[1:], b.logprobs[1:])) > 1e-2


@pytest.mark.parametrize("prefix_words", [0, 7, 40])
def test_exact_sharing_equals_off(qwen_lm, prefix_words):
    prefix = " ".join(f"w{i}" for i in range(prefix_words))
    prompts = [prefix + f" branch {k}: the number is {k * 7}" for k in range(4)]
    assert_lossless(run_both_modes(qwen_lm, prompts, Sampling(max_new_tokens=12)))


def test_a_bfs_search_is_the_same_with_sharing_on_and_off(qwen_lm):
    from reliability_problems import Words

    results = []
    for mode in ("off", "exact"):
        s = Searcher(
            qwen_lm,
            Words(width=3, depth=2, max_new_tokens=4, chain=True),
            BFS(breadth=2),
            RKSCConfig(kv_sharing=mode),
            progress=False,
        )
        results.append(s.solve("cats"))
    off, exact = results
    assert len(off.tree) > 4
    assert_same_search([off], [exact])
    assert off.stats["reused_tokens"] == 0 and exact.stats["reused_tokens"] > 0
