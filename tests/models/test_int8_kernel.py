"""The int8 product (`treesearch.models.int8_kernel` over the blocked layout of
`treesearch.models.int8_blocks`), in each build this CPU runs (AVX-512 and AVX2): it equals the
float64 product of the dequantized weights; a row's result is the same bits alone, inside batches of
any size (every tile shape) and at any thread count; a projection's parts side by side equal each
part alone; embedding rows read from the blocked table are exact; the torch path computes the same
within float32 rounding."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.models import int8_blocks, int8_kernel, quantize

# the builds this CPU runs: AVX-512 runs AVX2's too
VARIANTS = {"avx512": ["avx512", "avx2"], "avx2": ["avx2"], None: []}[int8_kernel.variant()]


@pytest.fixture(scope="module", params=VARIANTS or [None])
def kernel(request):
    """int8_kernel with the build of one variant installed as its library (restored after)."""
    if request.param is None or int8_kernel.load() is None:
        pytest.skip(f"the int8 kernel is {int8_kernel.reason()}")
    saved = dict(int8_kernel._state)
    int8_kernel._state["dll"] = int8_kernel.build(request.param)[0]
    yield int8_kernel
    int8_kernel._state.clear()
    int8_kernel._state.update(saved)


def operands(rows: int, k: int, n: int, seed: int, bias: bool, other: bool):
    """x [rows, K], the plain int8 weight [N, K] and its scale, bias or None, other or None."""
    g = torch.Generator().manual_seed(seed)
    w, s = quantize.quantize_rows(torch.randn(n, k, generator=g))
    x = torch.randn(rows, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    o = torch.randn(rows, n, generator=g) if other else None
    return x, w, s, b, o


def reference(x, w, s, b, o) -> torch.Tensor:
    ref = x.double() @ (w.double() * s.double()[:, None]).T
    if b is not None:
        ref += b.double()
    if o is not None:
        ref += o.double()
    return ref


def test_the_layout_holds_16_channels_k_major_and_round_trips():
    w = torch.arange(-60, 60, dtype=torch.int8).view(20, 6)  # 20 channels: two blocks, 12 zeros
    b = int8_blocks.block(w)
    assert b.shape == (2, 6, 16) and b.is_contiguous()
    assert int(b[1, 4, 3]) == int(w[19, 4]) and int(b[0, 2, 15]) == int(w[15, 2])
    assert not b[1, :, 4:].any()  # channels past N are zero
    assert torch.equal(int8_blocks.unblock(b, 20), w)
    assert int8_blocks.blocks(16) == 1 and int8_blocks.blocks(17) == 2 and int8_blocks.blocks(0) == 0


@settings(max_examples=80, deadline=None)
@given(
    rows=st.integers(0, 70),
    k=st.integers(1, 90),
    n=st.integers(1, 70),
    seed=st.integers(0, 2**16),
    bias=st.booleans(),
    other=st.booleans(),
    threads=st.sampled_from([1, 2]),
)
def test_the_kernel_equals_the_float64_product_of_the_dequantized_weights(
    kernel, rows, k, n, seed, bias, other, threads
):
    x, w, s, b, o = operands(rows, k, n, seed, bias, other)
    torch.set_num_threads(threads)
    try:
        y = kernel.linear(x, int8_blocks.block(w), s, b, o)
    finally:
        torch.set_num_threads(1)
    ref = reference(x, w, s, b, o)
    assert y.dtype == torch.float32 and y.shape == (rows, n)
    if rows:
        assert (y.double() - ref).abs().max().item() <= 1e-5 * (1 + ref.abs().max().item()) * k**0.5


@settings(max_examples=50, deadline=None)
@given(
    batch=st.integers(2, 70),
    k=st.sampled_from([1, 3, 7, 8, 15, 16, 33, 64, 200]),
    n=st.integers(1, 70),
    seed=st.integers(0, 2**16),
    bias=st.booleans(),
    other=st.booleans(),
    threads=st.sampled_from([1, 2]),
)
def test_a_rows_result_is_the_same_bits_alone_in_any_batch_and_at_any_thread_count(
    kernel, batch, k, n, seed, bias, other, threads
):
    """Every row alone (the one-row tile), in a batch of every size up to 9 from that row (the
    middle and wide tiles, with their short last tiles), and in the whole batch."""
    x, w, s, b, o = operands(batch, k, n, seed, bias, other)
    wb = int8_blocks.block(w)
    together = kernel.linear(x, wb, s, b, o)
    torch.set_num_threads(threads)
    try:
        for r in range(batch):
            alone = kernel.linear(x[r : r + 1], wb, s, b, None if o is None else o[r : r + 1])
            assert torch.equal(alone[0], together[r]), f"row {r} of {batch}"
        for size in range(2, min(batch, 9) + 1):
            for r0 in range(0, batch - size + 1, size):
                part = kernel.linear(x[r0 : r0 + size], wb, s, b, None if o is None else o[r0 : r0 + size])
                assert torch.equal(part, together[r0 : r0 + size]), f"rows {r0}..{r0 + size - 1}"
    finally:
        torch.set_num_threads(1)
    # a strided view of the rows (the decoder hands in column slices) gives the same bits
    wide = torch.cat([x, torch.randn(batch, 3)], dim=1)[:, :k]
    assert torch.equal(kernel.linear(wide, wb, s, b, o), together)


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 20),
    k=st.integers(1, 50),
    ns=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
    other=st.booleans(),
    threads=st.sampled_from([1, 2]),
)
def test_a_projections_parts_side_by_side_equal_each_part_alone(kernel, rows, k, ns, seed, other, threads):
    """q/k/v or gate/up as one call (`project`, the fused layer calls' product) over views of one
    buffer, each part's blocks a slice of it: the same bits as each part's own `linear`."""
    g = torch.Generator().manual_seed(seed)
    parts = [quantize.quantize_rows(torch.randn(n, k, generator=g)) for n in ns]
    buffer = torch.cat([int8_blocks.block(w) for w, _ in parts])
    views, b0 = [], 0
    for (_, s), n in zip(parts, ns):
        nb = int8_blocks.blocks(n)
        bias = torch.randn(n, generator=g) if n % 2 else None
        views.append((buffer[b0 : b0 + nb], s, bias))
        b0 += nb
    x = torch.randn(rows, k, generator=g)
    o = torch.randn(rows, sum(ns), generator=g) if other else None
    torch.set_num_threads(threads)
    try:
        y = kernel.project(x, kernel.proj(views), o)
    finally:
        torch.set_num_threads(1)
    alone = torch.cat([kernel.linear(x, w, s, b) for w, s, b in views], dim=1)
    assert torch.equal(y, alone if o is None else alone + o)


def test_embedding_rows_read_from_the_blocked_table_are_exact(kernel):
    x, w, s, _, _ = operands(1, 37, 41, 5, False, False)
    ids = torch.tensor([[40, 0], [17, 16], [15, 40]])
    assert torch.equal(kernel.rows(ids, int8_blocks.block(w), s), (w.float() * s[:, None])[ids])


def test_the_torch_path_computes_what_the_kernel_does(kernel, monkeypatch):
    x, w, s, b, o = operands(5, 70, 2100, 3, True, True)  # more channels than one fallback block
    wb = int8_blocks.block(w)
    y = kernel.linear(x, wb, s, b, o)
    monkeypatch.setattr(int8_kernel, "load", lambda: None)
    assert torch.allclose(int8_kernel.linear(x, wb, s, b, o), y, atol=1e-4)
    views = [(wb[:3], s[:40], None), (wb[3:], s[48:], b[48:])]
    ys = int8_kernel.project(x, int8_kernel.proj(views))
    ref = torch.cat([reference(x, w[:40], s[:40], None, None), reference(x, w[48:], s[48:], b[48:], None)], 1)
    assert torch.allclose(ys.double(), ref, atol=1e-4)
    ids = torch.tensor([[3, 0], [2099, 2]])
    assert torch.equal(int8_kernel.rows(ids, wb, s), (w.float() * s[:, None])[ids])


def test_a_weight_not_in_blocks_is_refused(kernel):
    x, w, s, _, _ = operands(2, 8, 20, 0, False, False)
    with pytest.raises(
        ValueError, match=r"an int8 weight of 20 channels is blocked \[2, K, 16\], not \(20, 8\)"
    ):
        kernel.linear(x, w, s)
