"""int8a8 (`treesearch.models.quantize.to_int8a8`, the w8a8 prototype wired as a quantization): the
int8 model's decoder layers re-laid out for the w8a8 product (no int8 or float32 copy of those kept),
the LM head and a tied embedding too, and its logits stay near int8's. The project's invariants
(the fast step equals the layers, exact sharing equals --kv off, a search in solve_many equals it
alone) do not hold for it yet (docs/guide/precision.md says why), so no test claims them."""

from __future__ import annotations

import pytest
import torch

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


def test_int8a8_logits_stay_near_int8s():
    a8, q = load_model("tiny", quantization="int8a8"), load_model("tiny", quantization="int8")
    ids = torch.tensor([[5, 17, 300, 42, 9, 1000]])
    with torch.no_grad():
        a, b = q.model(ids).logits, a8.model(ids).logits
    assert (a - b).abs().max().item() < 0.05 * a.abs().max().item()
