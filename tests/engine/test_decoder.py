"""The fast decode step (`treesearch.engine.decoder`) computes what the transformers layers compute: every
decode step's logits equal the layer path's within 1e-4 (fp32; the two differ only in the order of
floating-point sums: fused and oneDNN-packed matrix products, flash attention), and greedy tokens
are identical. Over prefix groups of every kind (shared by all rows, by a subset, by one row), on
the tiny model (which qualifies, so every other tiny-model test runs the new step too) and the
default model. On the default model each float32 path is also checked against a float64 run of the
layer path (the truth both round away from): the fast step within 1e-4 of it. The main cases run
with prefill on either path (`prefill_path`: the decoder's packed layers, the default, or the
transformers layers): the whole fast forward against the whole layer path."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.common.config import RKSCConfig, Sampling
from treesearch.engine import decoder, linear
from treesearch.engine.local import Engine
from treesearch.kernels import attend_kernel, runs_kernel
from treesearch.models.load import tiny_model

WORDS = " the cat sat on a mat and then it ran to big red house with one old dog".split()
TOL = 1e-4  # a float32 path against the float64 truth, and the two float32 paths on the tiny model
# The two float32 paths on the default model: each rounds away from the float64 run by up to about
# 7e-5 in a logit of size 16 (measured: layers 5.3e-5, fast 6.9e-5), so they may differ by the sum.
TOL_PAIR = 2e-4


def words(n: int, start: int = 0) -> str:
    return "".join(f" {WORDS[(start + i) % len(WORDS)]}" for i in range(n))


def decode_both(lm, prompts: list[str], cached: list[str], sampling: Sampling, paths=(False, True)):
    """Generate prompts after caching `cached` texts, on the layer path and the fast path: per path
    (generations, each decode step's logits). paths: which (fast_decode False, True) to run."""
    out = {}
    for fast in paths:
        eng = Engine(lm, RKSCConfig(kv_sharing="exact", fast_decode=fast))
        assert (eng.forward.decoder is not None) == fast
        for text in cached:
            eng.generate([text], Sampling(max_new_tokens=2))
        steps: list[torch.Tensor] = []
        step = eng.forward.step

        def record(*a, _step=step, _steps=steps, **kw):
            logits = _step(*a, **kw)
            _steps.append(logits.clone())
            return logits

        eng.forward.step = record
        out[fast] = (eng.generate(prompts, sampling), steps)
        eng.store.check_invariants()
    return out


def assert_same(out, tol: float = TOL) -> None:
    (g_layers, s_layers), (g_fast, s_fast) = out[False], out[True]
    assert [g.token_ids for g in g_fast] == [g.token_ids for g in g_layers]
    assert len(s_fast) == len(s_layers) > 0
    for a, b in zip(s_layers, s_fast):
        assert a.shape == b.shape
        assert (a.double() - b.double()).abs().max().item() <= tol
    for a, b in zip(g_layers, g_fast):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= tol


def test_the_tiny_model_qualifies_and_decodes_through_the_fast_step(tiny_lm):
    assert decoder.qualifies(tiny_lm.model)
    assert Engine(tiny_lm).forward.decoder is decoder.decoder_for(tiny_lm.model)  # packed once per model


@pytest.fixture(scope="module", params=["llama", "qwen2-own-head", "qwen2-tied"])
def arch_lm(request, tiny_lm):
    """The tiny Llama, and the tiny Qwen2 (q/k/v biases) with an LM head of its own and tied."""
    if request.param == "llama":
        return tiny_lm
    return tiny_model(seed=0, arch="qwen2", tied=request.param == "qwen2-tied")


def use_reader(reader: str, monkeypatch) -> None:
    """How the step reads its runs: the whole attention in the compiled step kernel
    (`attend_kernel`), or torch ops with the runs rows read apart through the compiled runs
    kernel, or with the own runs packed into one block or read in place row by row."""
    if reader == "step-kernel":
        if attend_kernel.load() is None:
            pytest.skip(f"the attention kernel is {attend_kernel.reason()}")
        monkeypatch.setattr(decoder, "ATTENTION", "kernel")
        return
    monkeypatch.setattr(decoder, "ATTENTION", "math")
    if reader == "kernel":
        if runs_kernel.load() is None:
            pytest.skip(f"the runs kernel is {runs_kernel.reason()}")
    else:
        monkeypatch.setattr(decoder, "RUNS_KERNEL", False)
    if reader == "in-place":
        monkeypatch.setattr(decoder, "PACK_SINGLES_BYTES", 0)


READERS = ["step-kernel", "kernel", "packed", "in-place"]


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("batch", [1, 3, 4, 6])
def test_fast_step_equals_layer_path_over_every_kind_of_prefix_group(
    arch_lm, batch, reader, monkeypatch, prefill_path
):
    use_reader(reader, monkeypatch)
    base, more = words(20), words(9, 5)
    # cached: the shared base, base + more (rows 0..1 read it: a subset), row 0's own prompt (one row)
    prompts = [
        base + more + f" Row {b}:" + words(b, b) if b < 2 else base + f" Row {b}:" + words(b, b)
        for b in range(batch)
    ]
    out = decode_both(
        arch_lm, prompts, [base, base + more, prompts[0]], Sampling(max_new_tokens=10, ignore_eos=True)
    )
    assert_same(out)


@pytest.mark.parametrize("reader", READERS)
def test_rows_own_runs_of_different_lengths_join_one_softmax(tiny_lm, reader, monkeypatch, plans):
    """Each row reads the shared base, then two runs of its own (cached in two calls) whose lengths
    differ from row to row: they give the layer path's logits whether the compiled kernel reads them
    (one table entry per row and run), or torch ops, their scores in one block padded to the longest
    row's, with the runs copied side by side into one K/V block for the step or read in place row
    by row (PACK_SINGLES_BYTES = 0); the plan sees exactly those runs."""
    use_reader(reader, monkeypatch)
    pack = reader == "packed"
    base = words(16)
    own = [words(2 + 3 * b, b) for b in range(4)]
    more = [words(5 - b, 7 + b) for b in range(4)]
    prompts = [base + own[b] + more[b] + f" Row {b}:" for b in range(4)]
    cached = [base] + [base + o for o in own] + [base + o + m for o, m in zip(own, more)]
    out = decode_both(tiny_lm, prompts, cached, Sampling(max_new_tokens=6, ignore_eos=True))
    assert_same(out)
    if reader == "step-kernel":  # no Plan: the kernel's table holds every run
        assert not plans
        return
    first = plans[-1]  # the last step of the prompts (every row still running)
    assert len(first.shared) == 1 and not first.parts
    if reader == "kernel":  # the same four runs a row, as table entries: (..., length) sorted by row
        assert first.runs is not None and not first.singles and first.packed is None
        assert first.runs.row_ptr.tolist() == [0, 4, 8, 12, 16]
        lens = first.runs.table[:, 5].view(4, 4).sum(1).tolist()
        assert len(set(lens)) > 1
        return
    assert first.runs is None
    assert sorted(first.singles) == [0, 1, 2, 3]
    # its two cached runs, then its own K/V as the scheduler keeps it: its part of the prefill
    # buffer and its decode chunk
    assert all(len(runs) == 4 for runs in first.singles.values())
    lens = [sum(r[2] for r in first.singles[b]) for b in range(4)]
    assert len(set(lens)) > 1 and first.single_len == max(lens)
    assert (first.packed is not None) == pack
    if pack:  # each row's own tokens, then -inf padding up to the longest row's
        mask = first.packed[2]
        assert mask.shape == (4, 1, 1, max(lens))
        assert [int((mask[b] == 0).sum()) for b in range(4)] == lens
        assert all(bool(torch.isinf(mask[b, ..., lens[b] :]).all()) for b in range(4))


def test_the_last_row_left_reads_its_padded_buffer_masked(tiny_lm, monkeypatch):
    """Rows padded to the longest prompt, then every row but the shortest one stops (a stop rule
    on both paths): the single row left decodes over a buffer with padding in it, as the layer
    path does."""
    from treesearch.engine.forward import Forward

    done = Forward.finished

    def finished(self, gen, sampling):
        return "stop" if len(gen) == 2 and self.stop_next.pop(0) else done(self, gen, sampling)

    monkeypatch.setattr(Forward, "finished", finished)
    prompts = [words(14), words(9, 3), words(3, 6)]  # the last, shortest, is left alone
    out = {}
    for fast in (False, True):
        eng = Engine(tiny_lm, RKSCConfig(kv_sharing="off", fast_decode=fast))
        eng.forward.stop_next = [True, True, False]  # checked in row order at the second token
        steps: list[torch.Tensor] = []
        step = eng.forward.step

        def record(batch, toks, *a, _step=step, _steps=steps, **kw):
            logits = _step(batch, toks, *a, **kw)
            _steps.append(logits.clone())
            return logits

        eng.forward.step = record
        out[fast] = (eng.generate(prompts, Sampling(max_new_tokens=8, ignore_eos=True)), steps)
    assert [len(g.token_ids) for g in out[True][0]] == [2, 2, 8]
    assert [s.shape[0] for s in out[True][1]] == [3] + [1] * 6
    assert_same(out)


def test_fast_step_equals_layer_path_without_sharing(tiny_lm, prefill_path):
    prompts = ["short", "a somewhat longer prompt with more words in it", "x " * 30]
    out = {}
    for fast in (False, True):
        eng = Engine(tiny_lm, RKSCConfig(kv_sharing="off", fast_decode=fast))
        out[fast] = eng.generate(prompts, Sampling(max_new_tokens=8))
    assert [g.token_ids for g in out[True]] == [g.token_ids for g in out[False]]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_steps_rope_table_is_the_rotary_embedding_at_each_rows_position(arch):
    """A step reads cos and sin' from a table made for many positions at once (`_step_rope`): the
    same bits as the model's rotary embedding at the step's own positions, as the table grows."""
    dec = decoder.Decoder(tiny_model(seed=0, arch=arch).model)
    half = dec.head_dim // 2
    for positions in ([0], [5, 3, 1023], [1024], [0, 4000, 17], [2047, 2048, 9000]):
        pos = torch.tensor(positions)[:, None]
        cos, sin = dec.rotary(torch.zeros(len(positions), 1, 1), position_ids=pos)  # [B, 1, d]
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        c, s = dec._step_rope(positions)
        assert c.shape == cos.shape and torch.equal(c, cos) and torch.equal(s, sin)
    assert dec._rope_table[0].shape[0] >= 9001


def test_a_weight_changed_in_place_is_repacked():
    lm = tiny_model(seed=1, num_layers=2)
    first = decoder.decoder_for(lm.model)
    assert decoder.decoder_for(lm.model) is first
    earlier = Engine(lm)  # its Forward holds the first packing
    with torch.no_grad():
        lm.model.model.layers[0].mlp.down_proj.weight.mul_(0.5)
    assert first.stale(lm.model)
    second = decoder.decoder_for(lm.model)
    assert second is not first
    prompts = [words(12) + " Row:"]
    sampling = Sampling(max_new_tokens=6, ignore_eos=True)
    layers = Engine(lm, RKSCConfig(fast_decode=False)).generate(prompts, sampling)
    assert earlier.generate(prompts, sampling)[0].token_ids == layers[0].token_ids
    assert earlier.forward.decoder is second


def test_a_model_that_does_not_qualify_takes_the_layer_path():
    lm = tiny_model(seed=0, num_layers=2, dtype="bfloat16")
    assert not decoder.qualifies(lm.model)
    assert Engine(lm).forward.decoder is None
    with pytest.raises(ValueError, match="decode through Forward.layers"):
        decoder.Decoder(lm.model)
    g = Engine(lm).generate([words(8)], Sampling(max_new_tokens=3))[0]
    assert len(g.token_ids) >= 1


@pytest.mark.real_model
def test_real_model_fast_step_equals_layer_path(real_lm, prefill_path):
    from treesearch.tasks import Game24

    g = Game24()
    states = [g.initial_state(p) for p in ("4 5 6 10", "1 1 4 6", "2 3 5 12")]
    prompts = [g.expand_prompt(s) for s in states]
    out = decode_both(real_lm, prompts, [prompts[0]], Sampling(max_new_tokens=16))
    assert_same(out, TOL_PAIR)
    # the float64 truth: the same model in float64 decodes through the layers (the fast step is float32 only)
    from treesearch.models.load import load_model

    lm64 = load_model(dtype=torch.float64)
    assert decoder.qualifies(real_lm.model) and not decoder.qualifies(lm64.model)
    truth = decode_both(lm64, prompts, [prompts[0]], Sampling(max_new_tokens=16), paths=(False,))[False]
    assert_same({False: truth, True: out[True]})


@pytest.mark.parametrize("attention", ["math", "flash"])
def test_without_onednn_and_with_either_attention_the_step_is_the_same(tiny_lm, monkeypatch, attention):
    """The plain fallbacks: fused weights through F.linear / addmm when torch lacks oneDNN, and
    SDPA's flash kernel for the attention parts."""
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    monkeypatch.setattr(decoder, "ATTENTION", attention)
    plain = decoder.Decoder(tiny_lm.model)
    assert not plain.layers[0].qkv.mkldnn
    base = words(20)
    prompts = [base + f" Row {b}:" + words(b, b) for b in range(3)]
    out = {}
    for fast in (False, True):
        eng = Engine(tiny_lm, RKSCConfig(kv_sharing="exact", fast_decode=fast))
        eng.generate([base], Sampling(max_new_tokens=2))
        if fast:
            eng.forward.decoder = plain
        out[fast] = eng.generate(prompts, Sampling(max_new_tokens=8, ignore_eos=True))
    assert [g.token_ids for g in out[True]] == [g.token_ids for g in out[False]]
    for a, b in zip(out[False], out[True]):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= TOL


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 4),
    width=st.integers(1, 300),
    pad=st.integers(0, 40),
    scale=st.floats(0.1, 60.0),
    seed=st.integers(0, 2**16),
)
def test_softmax_with_its_log_normaliser_equals_softmax_and_logsumexp(rows, width, pad, scale, seed):
    """The attention's softmax and log-sum-exp, from one fused softmax, over scores of any spread
    with -inf padding (the packed per-row runs): within float32 rounding of torch's own."""
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(rows, 3, 2, width, generator=gen) * scale
    s = torch.cat([s, torch.full((rows, 3, 2, pad), float("-inf"))], dim=-1)
    p, lse = decoder._softmax_lse(s)
    assert torch.equal(p, torch.softmax(s, dim=-1))
    ref = torch.logsumexp(s.double(), dim=-1)
    assert (lse.double() - ref).abs().max().item() <= 1e-6 * max(1.0, ref.abs().max().item())
    assert torch.isfinite(lse).all() and lse.dtype == torch.float32


def test_under_a_cache_budget_rows_own_runs_are_read_in_place(tiny_lm, monkeypatch, plans):
    """The packed block of own runs is a K/V copy the cache budget does not count, so an engine with
    a budget never makes it (its steps read every run in place); without one it does (torch ops; the
    compiled kernel never copies)."""
    monkeypatch.setattr(decoder, "ATTENTION", "math")
    monkeypatch.setattr(decoder, "RUNS_KERNEL", False)
    base = words(16)
    prompts = [base + words(3 + b, b) + f" Row {b}:" for b in range(3)]
    packed = {}
    for budget in (None, 10**9):
        eng = Engine(tiny_lm, RKSCConfig(kv_sharing="exact", cache_budget=budget))
        assert eng.forward.pack_own_runs is (budget is None)
        eng.generate([base], Sampling(max_new_tokens=2))
        for p in prompts:
            eng.generate([p], Sampling(max_new_tokens=2))
        plans.clear()
        out = eng.generate(prompts, Sampling(max_new_tokens=4, ignore_eos=True))
        assert plans and all(p.singles for p in plans)
        packed[budget] = ([p.packed is not None for p in plans], [g.token_ids for g in out])
    assert all(packed[None][0]) and not any(packed[10**9][0])
    assert packed[None][1] == packed[10**9][1]


def test_with_two_threads_the_attention_runs_on_one_and_the_step_is_the_same(tiny_lm, monkeypatch):
    """`SERIAL_ATTENTION`: under 2 torch threads each layer's attention runs on one thread (its small
    ops would each pay a fork/join) and the dense products on both; the count is restored after every
    layer, also when the attention raises; tokens are identical and logits within 1e-5 either way."""
    torch.set_num_threads(2)
    monkeypatch.setattr(decoder, "ATTENTION", "math")  # the torch ops (the kernel has its own threads)
    seen: list[int] = []
    attend = decoder.Decoder._attend

    def counting(self, *a, **kw):
        seen.append(torch.get_num_threads())
        return attend(self, *a, **kw)

    monkeypatch.setattr(decoder.Decoder, "_attend", counting)
    base = words(20)
    prompts = [base + f" Row {b}:" + words(b + 2, b) for b in range(4)]
    runs = {}
    for serial in (False, True):
        monkeypatch.setattr(decoder, "SERIAL_ATTENTION", serial)
        seen.clear()
        runs[serial] = decode_both(
            tiny_lm, prompts, [base], Sampling(max_new_tokens=6, ignore_eos=True), (True,)
        )
        assert set(seen) == ({1} if serial else {2}) and torch.get_num_threads() == 2
    (plain, plain_steps), (serial, serial_steps) = runs[False][True], runs[True][True]
    assert [g.token_ids for g in serial] == [g.token_ids for g in plain]
    for a, b in zip(plain_steps, serial_steps):
        assert (a - b).abs().max().item() <= 1e-5

    def failing(self, *a, **kw):
        raise RuntimeError("attention failed")

    monkeypatch.setattr(decoder.Decoder, "_attend", failing)
    with pytest.raises(RuntimeError, match="attention failed"):
        Engine(tiny_lm).generate(prompts, Sampling(max_new_tokens=2, ignore_eos=True))
    assert torch.get_num_threads() == 2


def test_float_projections_read_the_models_own_weights_and_the_head_keeps_no_copy(tiny_lm):
    from treesearch.models import int8_kernel

    if int8_kernel.load() is None:
        pytest.skip(f"the kernel is {int8_kernel.reason()}")
    model = tiny_lm.model
    dec = decoder.Decoder(model)
    att = model.model.layers[0].self_attn
    qkv = dec.layers[0].qkv
    assert [w.data_ptr() for w in qkv.ws] == [
        p.weight.data_ptr() for p in (att.q_proj, att.k_proj, att.v_proj)
    ]
    assert dec.head.packed is None and dec.head.ws[0].data_ptr() == model.lm_head.weight.data_ptr()
    # up to KERNEL_ROWS rows, a row's projections are the same bits alone as beside the others
    x = torch.randn(linear.KERNEL_ROWS, model.config.hidden_size)
    for lin in (qkv, dec.layers[0].gate_up, dec.head):
        together = lin(x)
        assert all(torch.equal(lin(x[r : r + 1])[0], together[r]) for r in (0, 5, linear.KERNEL_ROWS - 1))


def test_steps_wider_than_kernel_rows_take_the_packed_products_and_decode_the_same(tiny_lm, monkeypatch):
    prompts = ["short", "a somewhat longer prompt with more words in it", "x " * 30]
    sampling = Sampling(max_new_tokens=8)
    layers = Engine(tiny_lm, RKSCConfig(kv_sharing="off", fast_decode=False)).generate(prompts, sampling)
    monkeypatch.setattr(linear, "KERNEL_ROWS", 0)
    packed = Engine(tiny_lm, RKSCConfig(kv_sharing="off")).generate(prompts, sampling)
    assert [g.token_ids for g in packed] == [g.token_ids for g in layers]
    for a, b in zip(layers, packed):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= TOL
