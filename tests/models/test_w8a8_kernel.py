"""The w8a8 prototype product (`treesearch.models.w8a8_kernel`), in each build this CPU runs (VNNI
and AVX2): its activation rounding equals the torch rounding bit for bit; the product equals a
float64 evaluation of exactly the quantized maths (blocks of 32, K padded with zeros) and the torch
path bit for bit; a row's result is the same bits alone, inside batches of any size and at any
thread count."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.models import quantize, w8a8_blocks, w8a8_kernel

# the builds this CPU runs: a VNNI CPU runs the AVX2 build too
VARIANTS = {"vnni": ["vnni", "avx2"], "avx2": ["avx2"], None: []}[w8a8_kernel.variant()]


@pytest.fixture(scope="module", params=VARIANTS or [None])
def kernel(request):
    """w8a8_kernel with the build of one variant installed as its library (restored after)."""
    if request.param is None or w8a8_kernel.load() is None:
        pytest.skip(f"the w8a8 kernel is {w8a8_kernel.reason()}")
    saved = dict(w8a8_kernel._state)
    w8a8_kernel._state["dll"] = w8a8_kernel.build(request.param)[0]
    yield w8a8_kernel
    w8a8_kernel._state.clear()
    w8a8_kernel._state.update(saved)


def operands(rows: int, k: int, n: int, seed: int, bias: bool, other: bool):
    """x [rows, K] (some blocks all zero, some values tiny), the plain int8 weight [N, K] and its
    scale, bias or None, other or None."""
    g = torch.Generator().manual_seed(seed)
    w, s = quantize.quantize_rows(torch.randn(n, k, generator=g))
    x = torch.randn(rows, k, generator=g) * torch.rand(rows, 1, generator=g) * 4
    if rows and k > 40:
        x[0, 32:40] = 0  # part of a block zero
        x[-1, :32] = 0  # a whole block zero (its scale 0)
    b = torch.randn(n, generator=g) if bias else None
    o = torch.randn(rows, n, generator=g) if other else None
    return x, w, s, b, o


def reference(x, w, s, b, o) -> torch.Tensor:
    """The module docstring's maths in float64: each block's scale times its integer sum, summed
    over blocks, times the channel's scale, plus bias, plus other (the rounding of x is `quantize`'s,
    checked against a float64 rounding in its own test)."""
    q, sx = w8a8_kernel.quantize(x)
    nb = q.shape[1] // 32
    wp = torch.zeros(w.shape[0], nb * 32, dtype=torch.float64)
    wp[:, : w.shape[1]] = w.double()
    d = torch.einsum("rbk,nbk->rnb", q.double().view(x.shape[0], nb, 32), wp.view(w.shape[0], nb, 32))
    ref = (d * sx.double()[:, None, :]).sum(2) * s.double()
    if b is not None:
        ref += b.double()
    if o is not None:
        ref += o.double()
    return ref


def test_the_layout_holds_16_channels_4_k_biased_and_round_trips():
    w = torch.arange(-100, 100, dtype=torch.int8).view(20, 10)  # 2 blocks of channels, K padded to 32
    wl = w8a8_blocks.layout(w)
    assert wl.shape == (2, 8, 16, 4) and wl.dtype == torch.uint8 and wl.is_contiguous()
    assert int(wl[1, 2, 3, 1]) == int(w[19, 9]) + 128 and int(wl[0, 0, 15, 3]) == int(w[15, 3]) + 128
    assert (wl[1, :, 4:] == 128).all() and (wl[:, 3:] == 128).all()  # channels past N, k past K: w = 0
    assert torch.equal(w8a8_blocks.unlayout(wl, 20, 10), w)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(0, 12),
    k=st.integers(1, 200),
    seed=st.integers(0, 2**16),
    threads=st.sampled_from([1, 2]),
)
def test_the_rounding_of_activations_is_the_same_bits_in_c_and_torch_and_what_float64_says(
    kernel, rows, k, seed, threads
):
    x = operands(rows, k, 1, seed, False, False)[0]
    torch.set_num_threads(threads)
    try:
        q, sx = kernel.quantize_c(x, kernel.load())
    finally:
        torch.set_num_threads(1)
    tq, tsx = kernel.quantize(x)
    assert torch.equal(q, tq) and torch.equal(sx, tsx)
    if not rows:
        return
    xp = torch.zeros(rows, w8a8_blocks.padded(k), dtype=torch.float64)
    xp[:, :k] = x.double()
    amax = xp.view(rows, -1, 32).abs().amax(2)
    assert torch.equal(sx.double(), (amax / 127).float().double())  # scale: max |x| / 127
    ratio = (xp.view(rows, -1, 32) / sx.double().clamp_min(1e-300)[:, :, None]).view(rows, -1)
    assert (q.double() - ratio).abs().max().item() <= 0.5 + 1e-5  # rounded to nearest
    assert q.abs().max().item() <= 127


@settings(max_examples=80, deadline=None)
@given(
    rows=st.integers(0, 70),
    k=st.integers(1, 200),
    n=st.integers(1, 70),
    seed=st.integers(0, 2**16),
    bias=st.booleans(),
    other=st.booleans(),
    threads=st.sampled_from([1, 2]),
)
def test_the_kernel_equals_the_float64_quantized_maths_and_the_torch_path_bit_for_bit(
    kernel, rows, k, n, seed, bias, other, threads
):
    x, w, s, b, o = operands(rows, k, n, seed, bias, other)
    wl = w8a8_blocks.layout(w)
    torch.set_num_threads(threads)
    try:
        y = kernel.linear(x, wl, s, b, o)
    finally:
        torch.set_num_threads(1)
    assert y.dtype == torch.float32 and y.shape == (rows, n)
    assert torch.equal(y, kernel._torch_linear(x, wl, s, b, o))
    if rows:
        ref = reference(x, w, s, b, o)
        blocks = w8a8_blocks.padded(k) // 32
        assert (y.double() - ref).abs().max().item() <= 1e-6 * (1 + ref.abs().max().item()) * blocks


@settings(max_examples=50, deadline=None)
@given(
    batch=st.integers(2, 70),
    k=st.sampled_from([1, 3, 31, 32, 33, 64, 100, 200]),
    n=st.integers(1, 70),
    seed=st.integers(0, 2**16),
    bias=st.booleans(),
    other=st.booleans(),
    threads=st.sampled_from([1, 2]),
)
def test_a_rows_result_is_the_same_bits_alone_in_any_batch_and_at_any_thread_count(
    kernel, batch, k, n, seed, bias, other, threads
):
    """Every row alone (the one-row tile), in a batch of every size up to 13 from that row (the
    middle and wide tiles, with their short last tiles), and in the whole batch."""
    x, w, s, b, o = operands(batch, k, n, seed, bias, other)
    wl = w8a8_blocks.layout(w)
    together = kernel.linear(x, wl, s, b, o)
    torch.set_num_threads(threads)
    try:
        for r in range(batch):
            alone = kernel.linear(x[r : r + 1], wl, s, b, None if o is None else o[r : r + 1])
            assert torch.equal(alone[0], together[r]), f"row {r} of {batch}"
        for size in range(2, min(batch, 13) + 1):
            for r0 in range(0, batch - size + 1, size):
                part = kernel.linear(x[r0 : r0 + size], wl, s, b, None if o is None else o[r0 : r0 + size])
                assert torch.equal(part, together[r0 : r0 + size]), f"rows {r0}..{r0 + size - 1}"
    finally:
        torch.set_num_threads(1)
    wide = torch.cat([x, torch.randn(batch, 3)], dim=1)[:, :k]  # a strided view of the rows
    assert torch.equal(kernel.linear(wide, wl, s, b, o), together)


def test_the_torch_path_is_taken_where_nothing_builds_and_gives_the_same_bits(kernel, monkeypatch):
    x, w, s, b, o = operands(9, 70, 40, 3, True, True)
    wl = w8a8_blocks.layout(w)
    y = kernel.linear(x, wl, s, b, o)
    monkeypatch.setattr(w8a8_kernel, "load", lambda: None)
    assert torch.equal(w8a8_kernel.linear(x, wl, s, b, o), y)


def test_a_weight_not_laid_out_is_refused(kernel):
    x, w, s, _, _ = operands(2, 8, 20, 0, False, False)
    with pytest.raises(ValueError, match=r"laid out \[2, 8, 16, 4\] uint8, not \(20, 8\)"):
        kernel.linear(x, w, s)


def test_rounding_clamps_where_a_subnormal_scale_rounds_down_and_zero_blocks_give_zeros(kernel):
    """max |x| = 190 smallest subnormals: its scale 190/127 rounds to 1 subnormal, x / s = 190,
    clamped to 127 (both signs); an all-zero block: scale 0 and zeros."""
    tiny = torch.tensor(2.0**-149)
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 1], x[0, 2] = 190 * tiny, -190 * tiny, 64 * tiny
    q, sx = kernel.quantize_c(x, kernel.load())
    assert torch.equal(q, kernel.quantize(x)[0]) and torch.equal(sx, kernel.quantize(x)[1])
    assert q[0, :3].tolist() == [127, -127, 64] and float(sx[0, 0]) == float(tiny)
    assert float(sx[0, 1]) == 0 and not q[0, 32:].any()


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 20),
    k=st.integers(1, 100),
    ns=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
    other=st.booleans(),
    threads=st.sampled_from([1, 2]),
)
def test_a_projections_parts_side_by_side_equal_each_part_alone(kernel, rows, k, ns, seed, other, threads):
    """q/k/v or gate/up as one call (x rounded once) over views of one buffer: each part's bits."""
    g = torch.Generator().manual_seed(seed)
    parts = [quantize.quantize_rows(torch.randn(n, k, generator=g)) for n in ns]
    buffer = torch.cat([w8a8_blocks.layout(w) for w, _ in parts])
    views, b0 = [], 0
    for (_, s), n in zip(parts, ns):
        nb = -(-n // 16)
        views.append((buffer[b0 : b0 + nb], s, torch.randn(n, generator=g) if n % 2 else None))
        b0 += nb
    x = torch.randn(rows, k, generator=g)
    o = torch.randn(rows, sum(ns), generator=g) if other else None
    torch.set_num_threads(threads)
    try:
        y = kernel.project(x, kernel.proj(views, k), o)
    finally:
        torch.set_num_threads(1)
    alone = torch.cat([kernel.linear(x, w, s, b) for w, s, b in views], dim=1)
    assert torch.equal(y, alone if o is None else alone + o)


def test_a_compiler_without_vnni_gets_the_avx2_build_and_none_the_torch_path(monkeypatch):
    saved = dict(w8a8_kernel._state)
    real = w8a8_kernel.build

    def no_vnni(which, cc=None, defines=()):
        if which == "vnni":
            raise OSError("cc failed: unrecognized option -mavx512vnni")
        return real(which, cc, defines)

    def no_cc(which, cc=None, defines=()):
        raise OSError("no cc")

    try:
        monkeypatch.setattr(w8a8_kernel, "variant", lambda flags=None: "vnni")
        monkeypatch.setattr(w8a8_kernel, "build", no_vnni)
        w8a8_kernel._state.clear()
        assert w8a8_kernel.load() is not None and w8a8_kernel.reason().startswith("compiled (avx2")
        monkeypatch.setattr(w8a8_kernel, "build", no_cc)
        w8a8_kernel._state.clear()
        with pytest.warns(RuntimeWarning, match="through torch"):
            assert w8a8_kernel.load() is None
        assert w8a8_kernel.reason() == "not available: no cc"
    finally:
        w8a8_kernel._state.clear()
        w8a8_kernel._state.update(saved)
