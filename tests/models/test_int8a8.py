"""int8a8 (`treesearch.models.quantize.to_int8a8`, the w8a8 prototype wired as a quantization): the
int8 model's decoder layers re-laid out for the w8a8 product (no int8 or float32 copy of those kept),
the LM head and a tied embedding too, and its logits stay near int8's. The fast step against the
layers, and the project's invariants (exact sharing equals --kv off, a search in solve_many equals
it alone) are checked but known not to hold yet (see LIMIT)."""

from __future__ import annotations

import pytest
import torch
from reliability_problems import Words
from same_results import assert_same
from test_int8 import assert_sharing_equals_off, run_both_paths, words

from strategies import BFS
from treesearch.common.config import RKSCConfig, Sampling
from treesearch.engine import decoder
from treesearch.engine.linear import A8Linear
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


# Known not to hold (measured on the tiny models): rounding activations to int8 is a step function,
# so ulp-level differences upstream of a product (attention over a shared prefix, a prompt part
# prefilled in another chunk: about 1e-5 in int8's logits, within these tests' tolerance; the
# layers and the fast step applying a norm's weight in another order) move an activation across a
# rounding boundary now and then, and the logits by 1e-2 to 1e-1: enough to change a greedy token
# of a tiny random model. The product itself is batch invariant bit for bit (test_w8a8_kernel.py);
# these hold only once everything upstream is bit-identical too.
LIMIT = "int8a8 amplifies the ulp differences of attention and prefill chunking (see the note above)"


@pytest.mark.xfail(reason=LIMIT, strict=False)
def test_the_fast_step_decodes_as_the_layers_do(lm):
    """Greedy tokens identical, logits close: the layers apply each norm's weight in another order
    than the fast step, so an activation may round to the next int8 step (LIMIT)."""
    base = words(20)
    prompts = [base + f" Row {b}:" + words(b, b) for b in range(4)]
    out = run_both_paths(lm, prompts, [base, prompts[0]], Sampling(max_new_tokens=10, ignore_eos=True))
    (g_layers, s_layers), (g_fast, s_fast) = out[False], out[True]
    assert [g.token_ids for g in g_fast] == [g.token_ids for g in g_layers]
    for a, b in zip(s_layers, s_fast):
        assert (a - b).abs().max().item() <= 1e-2 * (1 + a.abs().max().item())


def test_int8a8_logits_stay_near_int8s():
    a8, q = load_model("tiny", quantization="int8a8"), load_model("tiny", quantization="int8")
    ids = torch.tensor([[5, 17, 300, 42, 9, 1000]])
    with torch.no_grad():
        a, b = q.model(ids).logits, a8.model(ids).logits
    assert (a - b).abs().max().item() < 0.05 * a.abs().max().item()


@pytest.mark.xfail(reason=LIMIT, strict=False)
def test_int8a8_exact_sharing_equals_off(lm):
    prompts = [" ".join(f"w{i}" for i in range(7)) + f" branch {k}: the number is {k * 7}" for k in range(4)]
    assert_sharing_equals_off(lm, prompts, Sampling(max_new_tokens=12))


@pytest.mark.xfail(reason=LIMIT, strict=False)
def test_int8a8_solve_many_equals_each_input_solved_alone(lm):
    inputs = ["cats", "dogs", "birds", "fish"]
    problem = Words(width=2, depth=3, max_new_tokens=5, samples=2, temperature=0.9)

    def searcher():
        from treesearch.search.searcher import Searcher

        return Searcher(lm, problem, BFS(breadth=2), RKSCConfig(), progress=False, seed=5)

    alone = [searcher().solve(x) for x in inputs]
    assert_same(alone, list(searcher().solve_many(inputs, concurrency=3)))
