"""int8a8 (`treesearch.models.quantize.to_int8a8`, the w8a8 prototype wired as a quantization): the
int8 model's decoder layers re-laid out for the w8a8 product (no int8 or float32 copy of those kept),
the LM head and a tied embedding too, and its logits stay near int8's. With every row's forward
batch invariant (tests/engine/test_batch_invariance.py) the project's invariants hold for it bit
for bit: exact sharing gives --kv off's tokens and scores, a search in solve_many equals it alone.
The fast step against the transformers layers is not claimed (another order of sums before each
rounding)."""

from __future__ import annotations

import pytest
import torch

from treesearch.common.config import RKSCConfig, Sampling
from treesearch.engine import decoder
from treesearch.engine.linear import A8Linear
from treesearch.engine.local import Engine
from treesearch.models import quantize
from treesearch.models.load import load_model, tiny_model


@pytest.fixture(scope="module", params=["llama", "qwen2-own-head", "qwen2-tied"])
def lm(request):
    if request.param == "llama":
        return load_model("tiny", quantization="int8a8")
    lm = tiny_model(seed=0, arch="qwen2", tied=request.param == "qwen2-tied")
    quantize.to_int8a8(quantize.quantize(lm.model))
    return lm


def test_the_layers_hold_the_w8a8_layout_only_and_the_decoder_reads_it(lm):
    m = lm.model
    assert quantize.is_quantized(m) and m.treesearch_quantization == "int8a8" and decoder.qualifies(m)
    tensors = [*m.parameters(), *m.buffers()]
    assert all(t.dim() < 2 or t.dtype in (torch.int8, torch.uint8) for t in tensors)
    layer = m.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, quantize.W8A8Linear)
    assert layer.self_attn.k_proj.qweight.data_ptr() > layer.int8.qkv.data_ptr()  # views of one buffer
    dec = decoder.decoder_for(m)
    assert isinstance(dec.layers[0].qkv, A8Linear) and dec.fused is None  # unfused: a prototype
    assert dec.layers[0].qkv.parts[0][0].data_ptr() == layer.int8.qkv.data_ptr()
    assert isinstance(m.lm_head, quantize.W8A8Linear) and isinstance(dec.head, A8Linear)
    tied = m.config.tie_word_embeddings
    assert (m.lm_head.qweight is m.model.embed_tokens.qweight) == tied
    assert isinstance(m.model.embed_tokens, quantize.W8A8Embedding if tied else quantize.Int8Embedding)


def test_embedding_and_head_rows_read_from_the_w8a8_table_are_exact():
    lm = tiny_model(seed=0, arch="qwen2", tied=True)
    quantize.quantize(lm.model)
    vocab = lm.model.model.embed_tokens.num_embeddings
    ids = torch.tensor([[3, 0], [vocab - 1, 17]])
    want = lm.model.model.embed_tokens(ids)  # the int8 table's rows
    quantize.to_int8a8(lm.model)
    assert torch.equal(lm.model.model.embed_tokens(ids), want)
    assert torch.equal(lm.model.lm_head.weight_rows(ids), want)


def test_int8a8_logits_stay_near_int8s():
    a8, q = load_model("tiny", quantization="int8a8"), load_model("tiny", quantization="int8")
    ids = torch.tensor([[5, 17, 300, 42, 9, 1000]])
    with torch.no_grad():
        a, b = q.model(ids).logits, a8.model(ids).logits
    assert (a - b).abs().max().item() < 0.05 * a.abs().max().item()


LABELS = [" sure", " likely", " impossible"]


def test_int8a8_exact_sharing_gives_kv_offs_tokens_and_scores_bit_for_bit(lm):
    """Prompts that share a prefix with each other and with what was cached before: with sharing
    their prompts are prefilled over cached runs, cut where the other prompts diverge; off, each
    in one chunk."""
    base = " the cat sat on a mat and then it ran to the big red house" * 3
    prompts = [base + f" Row {b}:" + " one old dog" * b for b in range(4)]
    out = {}
    for mode in ("off", "exact"):
        eng = Engine(lm, RKSCConfig(kv_sharing=mode))
        eng.generate([base], Sampling(max_new_tokens=2))
        gens = eng.generate(prompts, Sampling(max_new_tokens=12, ignore_eos=True))
        scores = eng.score(prompts, LABELS)
        out[mode] = ([g.token_ids for g in gens], [g.logprobs for g in gens], [s.probs for s in scores])
        eng.store.check_invariants()
        if mode == "exact":
            assert eng.stats.reused_tokens > 0  # the comparison exercised the shared path
    assert out["exact"] == out["off"]


@pytest.mark.real_model
def test_real_model_int8a8_game24_in_solve_many_equals_alone():
    """Two searches in flight (their prompts share the few-shot prefix, their steps share a batch)
    make the same trees as each alone: the decisions int8a8 used to change (55% of them equal with
    16 in flight before every row's forward was batch invariant)."""
    from same_results import assert_same

    from strategies import BFS
    from treesearch.search.searcher import Searcher
    from treesearch.tasks import Game24

    lm = load_model(quantization="int8a8")
    puzzles = ["4 5 6 10", "1 2 4 7"]

    def searcher():
        return Searcher(lm, Game24(), BFS(breadth=2), RKSCConfig(), progress=False)

    alone = [searcher().solve(x) for x in puzzles]
    assert_same(alone, list(searcher().solve_many(puzzles, concurrency=2)))
