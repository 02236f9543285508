"""Dummy-weight models of real shapes (`dummy:NAME`): the shipped configs give the real parameter
counts, weights are seeded and in the requested dtype, the engine runs them losslessly (fp32), and
the shipped tokenizer is the default model's. Built with fewer layers where the width is what counts."""

from __future__ import annotations

import pytest
import torch

from treesearch import Engine, RKSCConfig, Sampling, load_model
from treesearch.common.errors import ConfigError
from treesearch.models.dummy import build_config, config_dict, dummy_model, known_names, shipped_tokenizer

# published parameter counts of the real models (embeddings and LM head included)
PARAMS = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.2-1b": 1_235_814_400,
    "qwen2.5-7b": 7_615_616_512,
    "smollm2-135m": 134_515_008,
}
LABELS = [" yes", " no"]


@pytest.fixture(scope="module")
def llama1b_one_layer():
    """Llama-3.2-1B's width and vocabulary with one decoder layer, bf16 (about 0.6 GB)."""
    return dummy_model("dummy:llama-3.2-1b", num_layers=1, dtype="bfloat16")


def test_shipped_configs_have_a_source_and_the_real_parameter_counts():
    from transformers import AutoModelForCausalLM

    assert known_names() == sorted(PARAMS)
    tok = shipped_tokenizer()
    for name, count in PARAMS.items():
        raw = config_dict(name)
        assert raw["_source"] and raw["vocab_size"] >= len(tok) == 49152
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(build_config(name, tok))
        assert sum(p.numel() for p in model.parameters()) == count, name
        base = model.model  # the structure the engine drives
        assert all(hasattr(base, a) for a in ("embed_tokens", "rotary_emb", "layers", "norm"))
        assert model.config.eos_token_id == tok.eos_token_id == 2 and model.config.bos_token_id == 1


def test_unknown_dummy_name_lists_the_known_ones():
    with pytest.raises(ConfigError) as err:
        load_model("dummy:llama-9")
    assert "unknown dummy model 'dummy:llama-9'" in str(err.value)
    for name in PARAMS:
        assert f"dummy:{name}" in str(err.value)


def test_load_model_builds_the_named_shape_in_the_requested_dtype():
    lm = load_model("dummy:SmolLM2-135M", dtype="bfloat16")
    assert lm.name == "dummy:smollm2-135m"
    assert (lm.num_layers, lm.num_kv_heads, lm.head_dim, lm.max_context) == (30, 3, 64, 8192)
    assert lm.dtype == torch.bfloat16 and lm.device.type == "cpu"
    assert sum(p.numel() for p in lm.model.parameters()) == PARAMS["smollm2-135m"]
    assert lm.model.config._attn_implementation == "treesearch"


def test_a_layers_suffix_keeps_the_first_layers_of_the_named_shape():
    lm = load_model("dummy:smollm2-135m@2layers")
    assert lm.name == "dummy:smollm2-135m@2layers" and lm.num_layers == 2 == len(lm.model.model.layers)
    assert lm.model.config.hidden_size == 576
    with pytest.raises(ConfigError, match="asks for 2 layers and num_layers=3"):
        dummy_model("dummy:smollm2-135m@2layers", num_layers=3)


def test_weights_are_seeded_norms_are_one_and_embeddings_stay_tied():
    a = dummy_model("smollm2-135m", num_layers=2, seed=0)
    b = dummy_model("smollm2-135m", num_layers=2, seed=0)
    c = dummy_model("smollm2-135m", num_layers=2, seed=1)
    for (name, pa), (_, pb), (_, pc) in zip(
        a.model.named_parameters(), b.model.named_parameters(), c.model.named_parameters()
    ):
        assert torch.equal(pa, pb), name
        if "norm" in name:
            assert torch.equal(pa, torch.ones_like(pa)) and torch.equal(pc, pa), name
        else:
            assert not torch.equal(pa, pc), name
            assert abs(float(pa.detach().std()) - 0.02) < 0.002, name  # initializer_range
    assert a.model.lm_head.weight is a.model.model.embed_tokens.weight


def test_rotary_frequencies_equal_a_normally_built_models(llama1b_one_layer):
    """inv_freq is computed, not loaded: after the meta-device build it must be recomputed (llama3 rope)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    lm = llama1b_one_layer
    ref = LlamaRotaryEmbedding(config=lm.model.config)
    got = lm.model.model.rotary_emb
    assert got.inv_freq.dtype == torch.float32
    assert torch.equal(got.inv_freq, ref.inv_freq) and got.attention_scaling == ref.attention_scaling
    assert lm.model.config.rope_parameters["rope_type"] == "llama3"


def test_qwen_shape_has_zero_biases_and_an_untied_head():
    lm = dummy_model("dummy:qwen2.5-7b", num_layers=1, dtype="bfloat16")
    attn = lm.model.model.layers[0].self_attn
    assert attn.q_proj.bias.shape == (3584,) and attn.k_proj.bias.shape == (512,)
    assert not attn.q_proj.bias.any() and not attn.v_proj.bias.any()
    assert lm.model.lm_head.weight is not lm.model.model.embed_tokens.weight
    assert (lm.num_kv_heads, lm.head_dim) == (4, 128)


def test_fixed_length_generation_samples_ids_past_the_tokenizer_and_decodes_them(llama1b_one_layer):
    lm = llama1b_one_layer
    eng = Engine(lm, RKSCConfig(kv_sharing="exact"))
    gens = eng.generate(
        ["Tom has 3 boxes of 4 apples.", "Tom has 3 boxes of 5 pears."],
        Sampling(max_new_tokens=6, ignore_eos=True),
    )
    assert [len(g.token_ids) for g in gens] == [6, 6] and [g.finish for g in gens] == ["length", "length"]
    ids = [t for g in gens for t in g.token_ids]
    assert any(t >= len(lm.tokenizer) for t in ids)  # rows the tokenizer never feeds, only sampled
    assert max(ids) < lm.model.config.vocab_size
    assert all(isinstance(g.text, str) for g in gens)  # unknown ids decode to nothing, no error


def test_exact_equals_off_on_a_dummy_model_in_fp32():
    lm = dummy_model("dummy:smollm2-135m", num_layers=3, dtype="float32")
    prefix = "Question: a farmer has 17 sheep and buys 5 more. How many sheep? Branch"
    prompts = [f"{prefix} {k}: let us think" for k in range(4)]
    out = {}
    for mode in ("off", "exact"):
        eng = Engine(lm, RKSCConfig(kv_sharing=mode))
        gens = eng.generate(prompts, Sampling(max_new_tokens=8, ignore_eos=True))
        scores = eng.score([p + " Correct?" for p in prompts], LABELS)
        out[mode] = ([g.token_ids for g in gens], scores, eng.stats)
    assert out["exact"][0] == out["off"][0] and all(len(t) == 8 for t in out["off"][0])
    for a, b in zip(out["off"][1], out["exact"][1]):
        for lab in LABELS:
            assert b.probs[lab] == pytest.approx(a.probs[lab], abs=1e-4)
    assert out["exact"][2].reused_tokens > 0 == out["off"][2].reused_tokens


@pytest.mark.real_model
def test_shipped_tokenizer_equals_the_one_converted_from_the_gguf():
    from transformers import AutoTokenizer

    from treesearch.models.load import _converted_default_folder

    gguf = AutoTokenizer.from_pretrained(str(_converted_default_folder()))
    shipped = shipped_tokenizer()
    assert shipped.get_vocab() == gguf.get_vocab() and len(shipped) == len(gguf) == 49152
    assert (
        (shipped.bos_token_id, shipped.eos_token_id, shipped.pad_token_id, shipped.unk_token_id)
        == (gguf.bos_token_id, gguf.eos_token_id, gguf.pad_token_id, gguf.unk_token_id)
        == (1, 2, 2, 0)
    )
    for text in (
        "Hello world",
        "4 + 5 = 9 (left: 6 9 10)\n\n",
        "<|im_start|>user\nhi<|im_end|>",
        "  ünïcödé \t tabs  ",
        "x " * 50,
    ):
        ids = gguf.encode(text)
        assert shipped.encode(text) == ids
        assert shipped.encode(text, add_special_tokens=False) == gguf.encode(text, add_special_tokens=False)
        assert shipped.decode(ids) == gguf.decode(ids)
    chat = [{"role": "user", "content": "What is 2 + 2?"}]
    assert shipped.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    ) == gguf.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
