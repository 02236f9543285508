"""The float32 product of `treesearch.models.int8_kernel` (`float_linear`, the fast step's products of
up to `linear.KERNEL_ROWS` rows): equal to the float64 product within float32 rounding, the same bits
for a row alone or beside others at any thread count, written into a column slice of a wider result."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.models import int8_kernel


@pytest.fixture(scope="module")
def kernel():
    if int8_kernel.load() is None:
        pytest.skip(f"the kernel is {int8_kernel.reason()}")
    return int8_kernel


def operands(rows: int, k: int, n: int, seed: int, bias: bool, other: bool, scale: bool):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    x = torch.randn(rows, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    o = torch.randn(rows, n, generator=g) if other else None
    s = torch.rand(n, generator=g) + 0.5 if scale else None
    return x, w, b, o, s


def reference(x, w, b, o, s) -> torch.Tensor:
    ref = x.double() @ w.double().T
    if s is not None:
        ref *= s.double()
    if b is not None:
        ref += b.double()
    if o is not None:
        ref += o.double()
    return ref


@settings(max_examples=80, deadline=None)
@given(
    rows=st.integers(1, 17),
    k=st.integers(1, 80),
    n=st.integers(1, 40),
    seed=st.integers(0, 2**16),
    bias=st.booleans(),
    other=st.booleans(),
    scale=st.booleans(),
    threads=st.integers(1, 3),
)
def test_the_float_kernel_equals_the_float64_product(kernel, rows, k, n, seed, bias, other, scale, threads):
    x, w, b, o, s = operands(rows, k, n, seed, bias, other, scale)
    torch.set_num_threads(threads)
    try:
        y = kernel.float_linear(x, w, b, o, scale=s)
    finally:
        torch.set_num_threads(1)
    ref = reference(x, w, b, o, s)
    assert y.dtype == torch.float32 and y.shape == (rows, n)
    assert (y.double() - ref).abs().max().item() <= 1e-6 * (1 + ref.abs().max().item()) * k**0.5


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(2, 16),
    k=st.sampled_from([1, 7, 8, 15, 16, 33, 64, 200]),
    n=st.integers(1, 40),
    seed=st.integers(0, 2**16),
    bias=st.booleans(),
    other=st.booleans(),
    threads=st.integers(1, 3),
)
def test_a_rows_float_result_is_the_same_bits_alone_with_other_rows_and_at_any_thread_count(
    kernel, batch, k, n, seed, bias, other, threads
):
    x, w, b, o, _ = operands(batch, k, n, seed, bias, other, False)
    together = kernel.float_linear(x, w, b, o)
    torch.set_num_threads(threads)
    try:
        for r in range(batch):
            alone = kernel.float_linear(x[r : r + 1], w, b, None if o is None else o[r : r + 1])
            assert torch.equal(alone[0], together[r])
    finally:
        torch.set_num_threads(1)


def test_parts_written_into_column_slices_equal_the_whole_product(kernel):
    x, w, b, o, _ = operands(5, 70, 30, 7, True, True, False)
    whole = kernel.float_linear(x, w, b, o)
    y = torch.full((5, 30), float("nan"))
    for n0, n1 in ((0, 11), (11, 12), (12, 30)):
        kernel.float_linear(x, w[n0:n1], b[n0:n1], o[:, n0:n1], out=y[:, n0:n1])
    assert torch.equal(y, whole)
    with pytest.raises(ValueError, match="unit column stride"):
        kernel.float_linear(x, w, out=torch.empty(30, 5).T)


def test_the_torch_path_computes_what_the_float_kernel_does(kernel, monkeypatch):
    x, w, b, o, s = operands(5, 70, 300, 3, True, True, True)
    y = kernel.float_linear(x, w, b, o, scale=s)
    monkeypatch.setattr(int8_kernel, "load", lambda: None)
    assert torch.allclose(int8_kernel.float_linear(x, w, b, o, scale=s), y, atol=1e-4)
    out = torch.empty(5, 300)
    assert int8_kernel.float_linear(x, w, b, o, scale=s, out=out) is out
    assert torch.allclose(out, y, atol=1e-4)
