"""The decode step's attention kernel (`treesearch.kernels.attend_kernel`): every row's softmax over
all the runs it reads (shared by several rows or its own, split into chunks of `CHUNK` tokens and
merged) equals float64 softmax attention over those tokens, bit for bit the same at any thread
count and whichever other rows share the step; it reads K/V in place through a run's strides."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.kernels import attend_kernel, chunk_attend
from treesearch.kernels.attend_kernel import StepRuns


@pytest.fixture(scope="module")
def kernel():
    fn = attend_kernel.load()
    if fn is None:
        pytest.skip(f"the attention kernel is {attend_kernel.reason()}")
    return fn


def make_runs(gen, layers, hkv, d, runs):
    """runs: (length, readers); each K/V a strided view ([L, 2, Hkv, n + 3, d], 3 tokens unused)."""
    table, kvs = StepRuns(), []
    for n, readers in runs:
        kv = torch.randn(layers, 2, hkv, n + 3, d, generator=gen)
        table.add(kv[:, 0], kv[:, 1], n, readers)
        kvs.append((kv, n, readers))
    table.done()
    return table, kvs


def truth(q, kvs, layer, row):
    """Float64 softmax attention of row's queries over every token of the runs it reads."""
    mine = [(kv, n) for kv, n, readers in kvs if row in readers]
    k = torch.cat([kv[layer, 0, :, :n] for kv, n in mine], dim=1).double()  # [Hkv, T, d]
    v = torch.cat([kv[layer, 1, :, :n] for kv, n in mine], dim=1).double()
    s = torch.einsum("hgd,htd->hgt", q[row].double(), k)
    return torch.einsum("hgt,htd->hgd", torch.softmax(s, dim=-1), v)


@settings(max_examples=80, deadline=None)
@given(
    rows=st.integers(1, 4),
    hkv=st.integers(1, 3),
    g=st.integers(1, 3),
    d=st.sampled_from([8, 12, 64]),
    runs=st.lists(st.tuples(st.integers(1, 300), st.integers(0, 15)), min_size=1, max_size=5),
    spread=st.floats(0.1, 4.0),
    seed=st.integers(0, 2**16),
)
def test_each_row_gets_float64_softmax_over_its_runs_at_any_thread_count(
    kernel, rows, hkv, g, d, runs, spread, seed
):
    gen = torch.Generator().manual_seed(seed)
    # readers from a bit mask over the rows; every row reads at least its own one-token buffer
    spec = [(n, [b for b in range(rows) if mask >> b & 1]) for n, mask in runs if mask % (1 << rows)]
    spec += [(1, [b]) for b in range(rows)]
    table, kvs = make_runs(gen, 2, hkv, d, spec)
    q = (torch.randn(rows, hkv * g * d + 5, generator=gen)[:, : hkv * g * d] * spread).view(rows, hkv, g, d)
    outs = []
    for threads in (1, 2, 3):
        out = torch.empty(rows, hkv, g, d)
        table.attend(kernel, 1, q, out, threads)
        outs.append(out)
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    for b in range(rows):
        ref = truth(q, kvs, 1, b)
        assert (outs[0][b].double() - ref).abs().max().item() <= 1e-5 * max(1.0, ref.abs().max().item())


def test_a_row_gets_the_same_bits_whichever_rows_share_its_step(kernel):
    """Row 0 alone, and beside two more rows that read the same shared run and runs of their own."""
    gen = torch.Generator().manual_seed(3)
    hkv, g, d = 3, 3, 64
    shared = torch.randn(2, 2, hkv, 700, d, generator=gen)
    own = torch.randn(2, 2, hkv, 9, d, generator=gen)
    q = torch.randn(3, hkv, g, d, generator=gen)
    alone, crowd = StepRuns(), StepRuns()
    alone.add(shared[:, 0], shared[:, 1], 700, [0])
    alone.add(own[:, 0], own[:, 1], 9, [0])
    crowd.add(shared[:, 0], shared[:, 1], 700, [0, 1, 2])
    crowd.add(own[:, 0], own[:, 1], 9, [0])
    crowd.add(own[:, 0], own[:, 1], 5, [2])
    for t in (alone, crowd):
        t.done()
    a, c = torch.empty(1, hkv, g, d), torch.empty(3, hkv, g, d)
    alone.attend(kernel, 0, q[:1], a, 2)
    crowd.attend(kernel, 0, q, c, 2)
    assert torch.equal(a[0], c[0])


def test_scores_far_apart_keep_the_softmax_exact(kernel):
    """One token far above the rest (its weight 1, the others' below e^-87: exactly 0 in float32)."""
    hkv, g, d = 1, 1, 8
    kv = torch.zeros(1, 2, hkv, 200, d)
    kv[0, 0, 0, 150] = 30.0  # the key that matches
    kv[0, 1, 0] = torch.arange(200.0)[:, None]  # v_i = i
    table = StepRuns()
    table.add(kv[:, 0], kv[:, 1], 200, [0])
    table.done()
    out = torch.empty(1, hkv, g, d)
    table.attend(kernel, 0, torch.ones(1, hkv, g, d), out, 2)
    assert torch.equal(out, torch.full_like(out, 150.0))


def test_the_avx2_build_gives_the_avx512_builds_bits(kernel):
    """Without AVX-512 VL the kernel builds narrower tiles (16 vector registers): the same sums in
    the same order, so the same bits, over a prefill chunk and a step."""
    import ctypes

    from treesearch.kernels import runs_kernel
    from treesearch.kernels.cbuild import build_openmp

    flags = runs_kernel._flags()
    if "-mavx2" not in flags:
        pytest.skip("this CPU builds no AVX2 variant")
    narrow = [f for f in flags if not f.startswith("-mavx512")]
    fns = []
    for each in (flags, narrow):
        dll, _ = build_openmp(attend_kernel.SOURCE, "attend", each)
        fn = dll.ts_attend
        fn.argtypes, fn.restype = attend_kernel._ARGS, ctypes.c_int
        fns.append(fn)
    gen = torch.Generator().manual_seed(5)
    hkv, g, d, rows, n, pre = 3, 3, 64, 3, 37, 300
    shared = torch.randn(2, 2, hkv, pre, d, generator=gen)
    own = [torch.randn(2, 2, hkv, n, d, generator=gen) for _ in range(rows)]
    q = torch.randn(rows, hkv * g, n, d, generator=gen)
    table = StepRuns()
    for b in range(rows):
        table.add(shared[:, 0], shared[:, 1], pre, [b])
        table.add(own[b][:, 0], own[b][:, 1], n - b, [b])
    table.done(queries=rows * n, spans=[(b, b * n, n - b, pre) for b in range(rows)])
    wide, thin = (chunk_attend.attend_chunk(fn, table, 1, q, hkv, 1.0) for fn in fns)
    assert torch.equal(wide, thin)
    assert torch.equal(wide[2, n - 2 :], torch.zeros_like(wide[2, n - 2 :]))  # padding queries: 0


@settings(max_examples=40, deadline=None)
@given(
    total=st.integers(1, 400),
    n=st.integers(1, 40),
    cuts=st.lists(st.integers(1, 399), max_size=4),
    hkv=st.integers(1, 2),
    g=st.integers(1, 3),
    d=st.sampled_from([8, 12, 64]),
    seed=st.integers(0, 2**16),
)
def test_a_chunks_queries_get_causal_float64_softmax_and_the_same_bits_however_the_context_is_cut(
    kernel, total, n, cuts, hkv, g, d, seed
):
    """A row's last n positions of a context of `total` tokens, as one run and cut into runs at
    `cuts`: each query over the keys up to its own position, within 1e-5 of float64, and the same
    bits for every cut (blocks of CHUNK positions from the context's start)."""
    n = min(n, total)
    gen = torch.Generator().manual_seed(seed)
    kv = torch.randn(1, 2, hkv, total, d, generator=gen)
    q = torch.randn(1, hkv * g, n, d, generator=gen)
    outs = []
    for bounds in ([0, total], sorted({0, total, *(c for c in cuts if c < total)})):
        table = StepRuns()
        for a, b in zip(bounds, bounds[1:]):
            table.add(kv[:, 0, :, a:], kv[:, 1, :, a:], b - a, [0])
        table.done(queries=n, spans=[(0, 0, n, total - n)])
        outs.append(chunk_attend.attend_chunk(kernel, table, 0, q, hkv, 1.0))
    assert torch.equal(outs[0], outs[1])
    k, v = kv[0, 0].double(), kv[0, 1].double()  # [Hkv, T, d]
    for j in range(n):
        p = total - n + j
        qj = q[0, :, j].double().view(hkv, g, d)
        s = torch.einsum("hgd,htd->hgt", qj, k[:, : p + 1])
        ref = torch.einsum("hgt,htd->hgd", torch.softmax(s, dim=-1), v[:, : p + 1]).reshape(hkv * g, d)
        got = outs[0][0, j].double()
        assert (got - ref).abs().max().item() <= 1e-5 * max(1.0, ref.abs().max().item())
