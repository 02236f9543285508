"""The local engine on Qwen2 (q/k/v biases, RoPE base 1e6, an LM head of its own or tied), on a tiny
random Qwen2: the fast step without the biases is not the layer path (the prefix-group cases of
the fast step run on Qwen2 in test_decoder.py's `arch_lm`), exact sharing equals sharing off
(tokens identical, scores within 1e-4), and a BFS search gives the same tree with sharing on and off."""

from __future__ import annotations

import pytest
import torch
from same_results import assert_same as assert_same_search
from test_decoder import assert_same, words
from test_lossless import LABELS
from test_lossless import _assert_same as assert_lossless
from test_lossless import _run_both as run_both_modes

from strategies import BFS
from treesearch import RKSCConfig, Sampling, Searcher
from treesearch.engine import decoder
from treesearch.engine.fused_step import FusedLayers
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


def test_the_fast_step_without_the_biases_is_not_the_layer_path(qwen_lm):
    """The comparison above can fail: the same step with q/k/v biases dropped from the packed
    weights gives other logits (so the biases are what makes it equal)."""
    prompts = [words(12) + " Row:"]
    eng = Engine(qwen_lm, RKSCConfig(kv_sharing="off", fast_decode=True))
    layers = Engine(qwen_lm, RKSCConfig(kv_sharing="off", fast_decode=False))
    unbiased = decoder.Decoder(qwen_lm.model)
    for layer in unbiased.layers:  # both the packed products' folded bias and the kernel's per part
        layer.qkv.bias = None
        layer.qkv.biases = [None] * len(layer.qkv.biases)
    unbiased.fused = FusedLayers.make(  # the compiled layer calls read the parts as they are now
        unbiased.layers, unbiased.eps, unbiased.heads, unbiased.kv_heads, unbiased.head_dim
    )
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


TEMPLATE = (
    "Can the numbers reach 24? Judge sure, likely or impossible.\nNumbers: 10 14\nJudgement: sure\n"
    "Numbers: 11 12\nJudgement: impossible\nNumbers: "
)
JUDGE = [TEMPLATE + n + "\nJudgement:" for n in ("4 5 6", "4 6 6", "2 5 6", "3 3 8")]


def test_asks_closed_gate_is_exact_and_an_open_gate_attaches_with_the_reference_exact(qwen_lm):
    exact = Engine(qwen_lm, RKSCConfig(kv_sharing="exact"))
    closed = Engine(qwen_lm, RKSCConfig(kv_sharing="asks", asks_tau=1.5))  # sigma <= 1 < tau
    opened = Engine(qwen_lm, RKSCConfig(kv_sharing="asks", asks_tau=-1.0))  # every pair attaches
    for e in (exact, closed, opened):
        e.score([TEMPLATE], LABELS)
    a, b, c = (e.score(JUDGE, LABELS) for e in (exact, closed, opened))
    assert all(abs(x.probs[k] - y.probs[k]) <= 1e-4 for x, y in zip(a, b) for k in LABELS)
    assert closed.stats.asks_attached == 0
    assert [y.asks_ref for y in c] == [None, 0, 0, 0] and opened.stats.asks_attached == 3
    assert all(abs(a[0].probs[k] - c[0].probs[k]) <= 1e-4 for k in LABELS)
    for e in (closed, opened):
        e.store.check_invariants()


def test_cgee_level_2_exits_where_the_rule_says_and_a_rule_that_never_exits_is_the_full_pass(qwen_lm):
    layers = qwen_lm.num_layers
    full = Engine(qwen_lm, RKSCConfig()).score(JUDGE, LABELS)
    never = Engine(qwen_lm, RKSCConfig()).score(JUDGE, LABELS, exit_rule=lambda layer, probs: False)
    assert [s.layers_run for s in never] == [layers] * len(JUDGE)
    assert all(abs(x.probs[k] - y.probs[k]) <= 1e-5 for x, y in zip(full, never) for k in LABELS)
    engine = Engine(qwen_lm, RKSCConfig())
    early = engine.score(
        JUDGE, LABELS, exit_rule=lambda layer, probs: torch.tensor([layer >= 2] * probs.shape[0])
    )
    assert [s.layers_run for s in early] == [2] * len(JUDGE)
    assert any(abs(x.probs[k] - y.probs[k]) > 1e-3 for x, y in zip(full, early) for k in LABELS)
    engine.store.check_invariants()


def test_a_search_under_a_cache_budget_is_the_search_without_one(qwen_lm):
    from reliability_problems import Words

    results = []
    for budget in (None, 120_000):  # bytes; the tiny Qwen2 holds 1 KiB of K/V per token
        s = Searcher(
            qwen_lm,
            Words(width=3, depth=3, max_new_tokens=4, chain=True),
            BFS(breadth=3),
            RKSCConfig(kv_sharing="exact", cache_budget=budget),
            progress=False,
        )
        results.append(s.solve("cats"))
        assert budget is None or s.engine.store.peak_held <= budget
    unbounded, bounded = results
    assert unbounded.stats["evicted_blocks"] == 0 and bounded.stats["evicted_blocks"] > 0
    assert bounded.stats["recomputed_tokens"] > 0
    assert_same_search([unbounded], [bounded])


@pytest.fixture(scope="module")
def qwen_05b():
    """Qwen2.5-Coder-0.5B-Instruct, loaded once (the first load converts the GGUF file, about a
    minute on one core); skipped, naming the install command, where it is not installed."""
    from treesearch.models import install as registry

    known = registry.KNOWN["qwen2.5-coder-0.5b"]
    if not known.installed():
        pytest.skip(f"{known.name} is not installed; install it with: {known.install_command}")
    return load_model(known.name)


# A few code prompts sharing a long instruction (the part exact sharing computes once).
QWEN_BASE = (
    "You are a careful Python programmer. For each task, write one line of Python that solves it, "
    "with no explanation. Use only the standard library. Keep names short and clear.\n"
    "Task: return the square of x\nCode: x * x\n"
    "Task: return the last item of a list xs\nCode: xs[-1]\n"
)
QWEN_TASKS = ("reverse a string s", "count the vowels in a string s", "sum the even numbers in a list xs")


def three_runs(lm, prompts: list[str], sampling: Sampling) -> dict:
    """(kv_sharing, fast_decode) -> (generations, label scores, stats, each decode step's logits) for
    sharing off and exact on the fast step, and exact on the layer path: one run fewer than
    comparing each pair on its own (the real model's runs take most of this test's time)."""
    out = {}
    for mode, fast in (("off", True), ("exact", True), ("exact", False)):
        eng = Engine(lm, RKSCConfig(kv_sharing=mode, fast_decode=fast))
        assert (eng.forward.decoder is not None) == fast
        steps: list[torch.Tensor] = []
        step = eng.forward.step

        def record(*a, _step=step, _steps=steps, **kw):
            logits = _step(*a, **kw)
            _steps.append(logits.clone())
            return logits

        eng.forward.step = record
        gens = eng.generate(prompts, sampling)
        out[mode, fast] = (gens, eng.score(prompts, LABELS), eng.stats, steps)
        eng.store.check_invariants()
    return out


@pytest.mark.real_model
def test_real_qwen_coder_05b_exact_sharing_and_the_fast_step_are_lossless(qwen_05b):
    """On the real 0.5B (q/k/v biases, RoPE base 1e6, its own LM head): exact sharing gives the tokens
    and label scores of sharing off, and the fast decode step the layer path's tokens and logits
    (measured on 2026-12-03: logits within 2.8e-5, label probabilities within 2e-6)."""
    assert qwen_05b.model.config.model_type == "qwen2" and decoder.qualifies(qwen_05b.model)
    prompts = [QWEN_BASE + f"Task: {t}\nCode:" for t in QWEN_TASKS]
    out = three_runs(qwen_05b, prompts, Sampling(max_new_tokens=8, ignore_eos=True))
    assert_lossless({mode: out[mode, True][:3] for mode in ("off", "exact")})
    assert out["exact", True][2].prefill_tokens < out["off", True][2].prefill_tokens / 2
    assert_same({fast: (out["exact", fast][0], out["exact", fast][3]) for fast in (False, True)})


@pytest.mark.real_model
def test_real_qwen_coder_05b_ends_on_im_end_and_on_endoftext(qwen_05b):
    """Its GGUF config names only <|im_end|> (151645) as EOS; <|endoftext|> (151643, Qwen2.5's end of
    document) is added by its `KnownModel.end_tokens`."""
    from treesearch.engine.eos import eos_token_ids

    tok = qwen_05b.tokenizer
    assert tok.convert_ids_to_tokens([151643, 151645]) == ["<|endoftext|>", "<|im_end|>"]
    assert eos_token_ids(qwen_05b.model, tok) == {151643, 151645}
