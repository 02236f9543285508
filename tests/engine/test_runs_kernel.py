"""The compiled runs kernel (`treesearch.kernels.runs_kernel`): each row's attention over the runs it
reads apart, merged into its joint softmax, equals the same softmax computed in float64 over the
joint part and every run's tokens, bit for bit the same at any thread count; it reads K/V in place
through any strides a run's view has; without a compiler, or turned off, the decoder reads the runs
with torch ops and decodes the same."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.common.config import RKSCConfig, Sampling
from treesearch.engine import decoder
from treesearch.engine.local import Engine
from treesearch.kernels import attend_kernel, runs_kernel
from treesearch.kernels.runs_kernel import RunTable


@pytest.fixture(scope="module")
def kernel():
    fn = runs_kernel.load()
    if fn is None:
        pytest.skip(f"the runs kernel is {runs_kernel.reason()}")
    return fn


def reference(q, out, lse, runs, layer):
    """Float64 truth: per row, softmax over the joint part (as its log-normaliser and output) and
    every token of the runs that row reads, times V."""
    bsz, hkv, g, d = q.shape
    res = out.double().clone()
    for b in range(bsz):
        mine = [(kv, used) for kv, used, readers in runs if b in readers]
        if not mine:
            continue
        k = torch.cat([kv[layer, 0, :, :used] for kv, used in mine], dim=1).double()  # [Hkv, n, d]
        v = torch.cat([kv[layer, 1, :, :used] for kv, used in mine], dim=1).double()
        s = torch.einsum("hgd,hnd->hgn", q[b].double(), k)
        joint = lse[b].double()[..., None]  # [Hkv, g, 1]
        top = torch.maximum(s.amax(-1, keepdim=True), joint)
        w, p = torch.exp(joint - top), torch.exp(s - top)
        res[b] = (w * out[b].double() + torch.einsum("hgn,hnd->hgd", p, v)) / (w + p.sum(-1, keepdim=True))
    return res


@settings(max_examples=120, deadline=None)
@given(
    rows=st.integers(1, 5),
    hkv=st.integers(1, 3),
    g=st.integers(1, 3),
    d=st.sampled_from([8, 64]),
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    spread=st.floats(0.1, 8.0),
    seed=st.integers(0, 2**16),
    threads=st.integers(1, 3),
)
def test_the_kernel_equals_the_float64_softmax_over_joint_part_and_runs(
    kernel, rows, hkv, g, d, lengths, spread, seed, threads
):
    q, out, lse, runs = random_case(rows, hkv, g, d, lengths, spread, seed)
    table = RunTable(rows, runs)
    for layer in range(LAYERS):
        got = out.clone()
        table.attend(kernel, layer, q, got, lse, threads)
        want = reference(q, out, lse, runs, layer)
        # float32 rounds a score s by about |s| 2^-24 and the exponent turns that into the same
        # relative error of its weight: the bound grows with the scores' scale, spread^2
        scale = max(1.0, spread**2 / 16)
        assert (got.double() - want).abs().max().item() <= 1e-5 * scale * max(1.0, want.abs().max().item())


LAYERS = 3


def random_case(rows, hkv, g, d, lengths, spread, seed):
    """q, the joint part (out, lse) and runs of the given lengths, each run read by 1-3 rows."""
    gen = torch.Generator().manual_seed(seed)
    runs = []
    for i, m in enumerate(lengths):
        # a view of a bigger tensor (room past `used`, heads and halves strided), as cached chunks are
        kv = torch.randn(LAYERS, 2, hkv, m + 5, d, generator=gen) * spread
        readers = sorted({(i + j) % rows for j in range(1 + i % 3)})
        runs.append((kv, m, readers))
    qk = torch.randn(rows, hkv * g + hkv, d, generator=gen) * spread  # q rows strided, as in the step
    qk[:, : hkv * g] *= d**-0.5  # q carries the attention scale, as the decoder's does
    q = qk[:, : hkv * g].view(rows, hkv, g, d)
    out = torch.randn(rows, hkv, g, d, generator=gen)
    lse = torch.randn(rows, hkv, g, generator=gen) * spread
    return q, out, lse, runs


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 9),
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=8),
    seed=st.integers(0, 2**16),
)
def test_the_kernel_gives_the_same_bits_at_any_thread_count(kernel, rows, lengths, seed):
    q, out, lse, runs = random_case(rows, 3, 3, 64, lengths, 2.0, seed)
    table = RunTable(rows, runs)
    results = []
    for threads in (1, 2, 4):
        got = out.clone()
        table.attend(kernel, 1, q, got, lse, threads)
        results.append(got)
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_the_table_has_one_entry_per_reading_row_sorted_by_row():
    a = torch.zeros(2, 2, 1, 7, 4)
    b = torch.zeros(2, 2, 1, 9, 4)
    table = RunTable(3, [(a, 5, [0, 2]), (b, 3, [2])])
    assert table.row_ptr.tolist() == [0, 1, 1, 3]
    assert table.table[:, 5].tolist() == [5, 5, 3]
    assert table.table[0].tolist() == [a.data_ptr(), 2 * 7 * 4, 7 * 4, 7 * 4, 4, 5]
    assert RunTable.fits(a) and not RunTable.fits(a.double()) and not RunTable.fits(a.transpose(3, 4))


def generate(lm, prompts, base, budget=None):
    eng = Engine(lm, RKSCConfig(kv_sharing="exact", cache_budget=budget))
    eng.generate([base], Sampling(max_new_tokens=2))
    for p in prompts[:2]:  # two rows get runs of their own
        eng.generate([p], Sampling(max_new_tokens=2))
    return eng.generate(prompts, Sampling(max_new_tokens=6, ignore_eos=True))


def test_under_a_budget_the_kernel_reads_the_runs_and_decodes_as_torch_ops_do(
    tiny_lm, kernel, monkeypatch, plans
):
    monkeypatch.setattr(decoder, "ATTENTION", "math")  # the torch-op attention, whose runs this kernel reads
    base = " the cat sat on a mat" * 3
    prompts = [base + f" row {b} ran" * (b + 1) for b in range(3)]
    with_kernel = generate(tiny_lm, prompts, base, budget=10**9)
    assert any(p.runs is not None for p in plans)
    monkeypatch.setattr(decoder, "RUNS_KERNEL", False)
    plans.clear()
    without = generate(tiny_lm, prompts, base, budget=10**9)
    assert plans and all(p.runs is None for p in plans)
    assert [g.token_ids for g in with_kernel] == [g.token_ids for g in without]
    for a, b in zip(with_kernel, without):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-5


@pytest.mark.parametrize("setting", ["off", "no-compiler"])
def test_without_the_kernel_the_step_reads_runs_with_torch_ops(tiny_lm, monkeypatch, setting, plans):
    """Neither compiled kernel (the step's attention kernel nor this one): torch ops throughout."""
    monkeypatch.setattr(runs_kernel, "_state", {})
    monkeypatch.setattr(attend_kernel, "_state", {})
    if setting == "off":
        monkeypatch.setenv("TREESEARCH_RUNS_KERNEL", "0")
    else:
        monkeypatch.setenv("CC", "false")  # a compiler that always fails
    assert runs_kernel.load() is None and attend_kernel.load() is None
    assert runs_kernel.reason() == (
        "off: TREESEARCH_RUNS_KERNEL=0" if setting == "off" else "not available: false failed: "
    )
    base = " the cat sat on a mat" * 3
    prompts = [base + f" row {b} ran" * (b + 1) for b in range(3)]
    out = generate(tiny_lm, prompts, base)
    assert plans and all(p.runs is None for p in plans) and any(p.singles for p in plans)
    assert all(len(g.token_ids) == 6 for g in out)
