"""Prefill and scoring on the fast path (`Decoder.layer_rows`: the packed products over a chunk of
tokens per row, the batch's own shared-prefix attention) compute what the transformers layers
compute: the K/V each chunk writes within 1e-5 of the layer path's (relative to the K/V's
largest magnitude, float32 rounding of sums taken in another order), last-position logits and
label probabilities within 1e-4 (tiny model) / 2e-4 (default model), and the same CGEE exits;
over prompt lengths, chunk splits and cached prefixes (hypothesis), on Llama and Qwen2."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.common.config import RKSCConfig, Sampling
from treesearch.common.stats import Stats
from treesearch.engine.local import Engine
from treesearch.models.load import tiny_model

WORDS = " the cat sat on a mat and then it ran to big red house with one old dog".split()
KV_TOL = 1e-5  # relative to the largest |K/V| of the chunk
TOL = 1e-4
TOL_PAIR = 2e-4  # the default model's two float32 paths (see tests/engine/test_decoder.py)


def ids_of(lm, n: int, start: int = 0) -> list[int]:
    text = "".join(f" {WORDS[(start + i) % len(WORDS)]}" for i in range(n))
    return lm.tokenizer(text)["input_ids"][:n]


def chunks(fwd, ids: list[list[int]], cuts: list[int]):
    """Prefill each row's ids in chunks (cut at the given offsets), each chunk over the row's
    earlier chunks as prefix runs: per chunk (K/V per row, last-position logits)."""
    prefixes: list[list] = [[] for _ in ids]
    out, start = [], 0
    for end in [*cuts, max(len(t) for t in ids)]:
        rows = [b for b, t in enumerate(ids) if len(t) > start]
        news = [ids[b][start:end] for b in rows]
        batch, logits = fwd.prefill(
            [prefixes[b] for b in rows],
            news,
            [start] * len(rows),
            extra=0,
            want_logits=True,
            charge=[Stats() for _ in rows],
        )
        out.append(([batch.row_kv(j, 0, len(t)) for j, t in enumerate(news)], logits))
        for j, b in enumerate(rows):
            prefixes[b].append((batch.row_run(j), len(news[j])))
        start = end
    return out


def both(lm, ids, cuts):
    eng = Engine(lm, RKSCConfig(kv_sharing="off"))
    assert eng.forward.decoder is not None
    out = {}
    with torch.no_grad():
        for fast in (False, True):
            eng.forward.fast_prefill = fast
            out[fast] = chunks(eng.forward, ids, cuts)
    return out


def assert_close(out, tol: float) -> None:
    for (kv_l, lg_l), (kv_f, lg_f) in zip(out[False], out[True]):
        for a, b in zip(kv_l, kv_f):
            assert a.shape == b.shape
            assert (a - b).abs().max().item() <= KV_TOL * max(1.0, a.abs().max().item())
        assert (lg_l - lg_f).abs().max().item() <= tol


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def arch_lm(request, tiny_lm):
    return tiny_lm if request.param == "llama" else tiny_model(seed=0, arch="qwen2", tied=False)


@settings(max_examples=25, deadline=None)
@given(
    lens=st.lists(st.integers(1, 70), min_size=1, max_size=3),
    cuts=st.lists(st.integers(1, 69), max_size=2, unique=True),
)
def test_fast_prefill_writes_the_layer_paths_kv_and_logits_over_any_chunking(arch_lm, lens, cuts):
    ids = [ids_of(arch_lm, n, b) for b, n in enumerate(lens)]
    cuts = sorted(c for c in cuts if c < max(lens))
    assert_close(both(arch_lm, ids, cuts), TOL)


def test_a_prompt_prefilled_in_chunks_gets_the_kv_of_one_chunk(tiny_lm):
    ids = [ids_of(tiny_lm, 90)]
    eng = Engine(tiny_lm, RKSCConfig(kv_sharing="off"))
    with torch.no_grad():
        whole = chunks(eng.forward, ids, [])
        parts = chunks(eng.forward, ids, [30, 61])
    kv = torch.cat([p[0][0] for p in parts], dim=3)
    assert (kv - whole[0][0][0]).abs().max().item() <= KV_TOL * kv.abs().max().item()
    assert (parts[-1][1] - whole[0][1]).abs().max().item() <= TOL


@pytest.mark.parametrize("kv", ["off", "exact"])
def test_scores_and_layer_exits_equal_the_layer_paths(arch_lm, kv):
    """Label probabilities (multi-token labels too) and per-row CGEE exits: the same rows stop at the
    same layers with the same probabilities on both paths."""
    prompts = [f"Is {a} + {a} = {2 * a}? Answer:" for a in range(1, 5)]
    labels = [" yes", " no", " yes indeed"]

    def rule(layer, probs):
        return probs[:, 0] > 0.34 if layer >= 2 else torch.zeros(probs.shape[0], dtype=torch.bool)

    out = {}
    for fast in (False, True):
        eng = Engine(arch_lm, RKSCConfig(kv_sharing=kv, fast_decode=fast))
        out[fast] = [eng.score(prompts, labels) for _ in range(2)] + [
            eng.score(prompts, labels, exit_rule=rule)
        ]
    for got, ref in zip(out[True], out[False]):
        for a, b in zip(got, ref):
            assert a.layers_run == b.layers_run
            assert max(abs(a.probs[k] - b.probs[k]) for k in labels) <= 1e-5


def test_prefill_and_scoring_take_the_fast_path_by_default_and_the_layers_on_request(tiny_lm, monkeypatch):
    """The default engine prefills and scores through `Decoder.layer_rows` and reads multi-token
    labels through the decoder's head; fast_decode=False, `FAST_PREFILL = False` and a model the
    decoder does not cover run the transformers layers."""
    from treesearch.engine import decoder, forward

    calls: list[int] = []
    rows = decoder.Decoder.layer_rows

    def counted(self, *a, **kw):
        calls.append(1)
        return rows(self, *a, **kw)

    monkeypatch.setattr(decoder.Decoder, "layer_rows", counted)
    eng = Engine(tiny_lm)
    assert eng.forward.fast_prefill
    eng.score(["Is 2 + 2 = 4? Answer:"], [" yes", " no", " yes indeed"])
    assert len(calls) == 2 * tiny_lm.num_layers  # the prompt, then the multi-token label's tail
    assert not Engine(tiny_lm, RKSCConfig(fast_decode=False)).forward.fast_prefill
    monkeypatch.setattr(forward, "FAST_PREFILL", False)
    calls.clear()
    eng = Engine(tiny_lm)
    assert not eng.forward.fast_prefill and eng.forward.decoder is not None
    eng.generate(["Is 2 + 2 = 4? Answer:"], Sampling(max_new_tokens=3))
    assert calls == []
    monkeypatch.setattr(forward, "FAST_PREFILL", True)
    other = tiny_model(seed=0, num_layers=2, dtype="bfloat16")
    assert not Engine(other).forward.fast_prefill


@pytest.mark.real_model
def test_real_model_scores_on_the_fast_path_equal_the_layer_paths(real_lm):
    """Game of 24 value prompts on the default model: the label probabilities of the fast forward
    within 1e-4 of the layer path's, and the same best label."""
    from treesearch.tasks import Game24

    g = Game24()
    prompts = [g.value_prompt(g.initial_state(p)) for p in ("4 5 6 10", "1 1 4 6", "2 3 5 12")]
    labels = list(g.labels)
    out = {}
    for fast in (False, True):
        eng = Engine(real_lm, RKSCConfig(kv_sharing="exact"))
        eng.forward.fast_prefill = fast
        out[fast] = eng.score(prompts, labels)
    for a, b in zip(out[False], out[True]):
        assert max(abs(a.probs[k] - b.probs[k]) for k in labels) <= 1e-4
        assert max(labels, key=a.probs.__getitem__) == max(labels, key=b.probs.__getitem__)


@pytest.mark.real_model
def test_real_model_fast_prefill_equals_the_layer_path_and_the_float64_truth(real_lm):
    """A 300-token prompt in three chunks and a second row beside it, on the default model; each
    float32 path against a float64 run of the layer path."""
    from treesearch.models.load import load_model

    ids = [ids_of(real_lm, 300), ids_of(real_lm, 120, 3)]
    cuts = [100, 200]
    out = both(real_lm, ids, cuts)
    assert_close(out, TOL_PAIR)
    lm64 = load_model(dtype=torch.float64)
    eng64 = Engine(lm64, RKSCConfig(kv_sharing="off", fast_decode=False))
    with torch.no_grad():
        truth = chunks(eng64.forward, ids, cuts)
    for fast in (False, True):
        assert_close({False: truth, True: [([k.float() for k in kv], lg) for kv, lg in out[fast]]}, TOL)
