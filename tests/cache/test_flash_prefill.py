"""Where the compiled attention kernel is off (`attention.KERNEL`) or cannot be built, a chunk of
several queries a row reads the batch's buffer through SDPA's CPU flash kernel: the mask it is
given says exactly which keys each query sees, and the result (output and log-normaliser, before
and after merging cached runs) is the matmul path's to float32 rounding, for grouped-query heads,
padded rows and chunks that continue a prefill. The compiled kernel (the default) is the matmul
path's to float32 rounding over the same cases too."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.cache import attention
from treesearch.cache.attention import BatchKV, flash_mask

NEEDS_KERNEL = pytest.mark.skipif(
    not hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"),
    reason="this torch has no CPU flash attention kernel",
)


@pytest.fixture(autouse=True)
def _no_compiled_kernel(request, monkeypatch):
    """These tests are of the torch path: the compiled kernel off unless a test asks for it."""
    if "compiled" not in request.node.name:
        monkeypatch.setattr(attention, "KERNEL", False)


def _mask(valid: list[list[bool]], write: int, n: int) -> torch.Tensor:
    """The [B, n, T] mask `BatchKV.begin` makes for buffer validity `valid` [B, write + n]."""
    kv = BatchKV(1, len(valid), 1, 4, write + n, torch.float32, "cpu")
    kv.valid[:, :write] = torch.tensor([row[:write] for row in valid], dtype=torch.bool)
    kv.begin(write, torch.tensor([row[write:] for row in valid], dtype=torch.bool))
    assert kv._mask is not None
    return kv._mask


def test_a_full_first_chunk_runs_plain_causal():
    assert flash_mask(_mask([[True] * 5, [True] * 5], 0, 5), 0, torch.float32) is True


def test_padded_rows_get_minus_infinity_exactly_where_a_key_is_hidden():
    mask = _mask([[True] * 4, [True, True, False, False]], 0, 4)
    how = flash_mask(mask, 0, torch.float32)
    assert isinstance(how, torch.Tensor) and how.shape == (2, 1, 4, 4) and how.dtype == torch.float32
    assert torch.equal(how[:, 0] == float("-inf"), ~mask)
    assert torch.equal(how[:, 0][mask], torch.zeros(int(mask.sum())))


def test_a_chunk_that_continues_a_prefill_is_masked_not_causal():
    """Queries at buffer positions 3..5 see keys 0..their own: not the kernel's top-left causal."""
    mask = _mask([[True] * 6], 3, 3)
    how = flash_mask(mask, 3, torch.float32)
    assert isinstance(how, torch.Tensor)
    assert (how[0, 0] == 0).sum(-1).tolist() == [4, 5, 6]


def test_one_query_a_row_or_a_query_with_no_key_takes_the_matmul_path():
    assert flash_mask(_mask([[True] * 4], 3, 1), 3, torch.float32) is False
    no_key = _mask([[True] * 3, [False] * 3], 0, 3)  # row 1 has nothing new in this chunk
    assert flash_mask(no_key, 0, torch.float32) is False


def _attend(flash: bool, seed: int, heads: int, hkv: int, lens: list[int], write: int, runs: int):
    """One layer's attention over a batch whose row b has lens[b] valid new tokens after `write`
    valid buffer tokens, beside `runs` cached runs every row reads -> (output, the mask the
    path used: False for the matmul path)."""
    torch.manual_seed(seed)
    d, n, bsz = 8, max(lens), len(lens)
    kv = BatchKV(1, bsz, hkv, d, write + n, torch.float32, "cpu")
    kv.valid[:, :write] = True
    kv.k[0, :, :, :write] = torch.randn(bsz, hkv, write, d)
    kv.v[0, :, :, :write] = torch.randn(bsz, hkv, write, d)
    prefix = [(torch.randn(1, 2, hkv, 5 + 3 * i, d), 4 + 3 * i) for i in range(runs)]
    kv.set_prefixes([prefix] * bsz)
    kv.begin(write, torch.tensor([[i < m for i in range(n)] for m in lens], dtype=torch.bool))
    if not flash:
        kv._flash = False  # what begin() leaves None is decided at the first layer: decide it here
    q, k, v = torch.randn(bsz, heads, n, d), torch.randn(bsz, hkv, n, d), torch.randn(bsz, hkv, n, d)
    return kv.attend(0, q, k, v, 1 / math.sqrt(d)), kv._flash


# chunks of a few rows over 0-2 cached runs, starting at the buffer's start or past it
CHUNKS = dict(
    seed=st.integers(0, 2**16),
    groups=st.sampled_from([(2, 2), (4, 2), (6, 2), (4, 1)]),
    lens=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    write=st.sampled_from([0, 0, 5]),
    runs=st.integers(0, 2),
)


@NEEDS_KERNEL
@settings(max_examples=40, deadline=None)
@given(**CHUNKS)
def test_the_flash_kernel_equals_the_matmul_path(seed, groups, lens, write, runs):
    """Outputs at the valid query positions agree within 1e-5, with or without cached runs."""
    if max(lens) < 2:
        lens = [*lens[:-1], 2]  # the flash path is for chunks of several queries
    heads, hkv = groups
    fast, how = _attend(True, seed, heads, hkv, lens, write, runs)
    slow, plain = _attend(False, seed, heads, hkv, lens, write, runs)
    assert how is not False and plain is False
    assert (how is True) == (write == 0 and len(set(lens)) == 1)
    for b, m in enumerate(lens):
        assert torch.allclose(fast[b, :m], slow[b, :m], atol=1e-5, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(**CHUNKS)
def test_the_compiled_kernel_equals_the_matmul_path(seed, groups, lens, write, runs):
    """The default chunk attention (`attention.KERNEL`): within 1e-5 of the matmul path at the
    valid query positions, 0 at the padding ones, with or without cached runs."""
    if attention.kernel() is None:
        pytest.skip("the attention kernel is not built here")
    heads, hkv = groups
    fast, how = _attend(True, seed, heads, hkv, lens, write, runs)
    assert how is None  # the flash path never ran
    attention.KERNEL = False
    try:
        slow, _ = _attend(False, seed, heads, hkv, lens, write, runs)
    finally:
        attention.KERNEL = True
    for b, m in enumerate(lens):
        assert torch.allclose(fast[b, :m], slow[b, :m], atol=1e-5, rtol=1e-5)
        assert not fast[b, m:].any()


@NEEDS_KERNEL
def test_a_bfloat16_chunk_stays_bfloat16_through_the_merge():
    """The kernel's log-normaliser is float32 at any dtype; merged with a cached run the output
    must still be q's dtype (bfloat16 models fed float32 into their next layer)."""
    d = 8
    kv = BatchKV(1, 2, 2, d, 5, torch.bfloat16, "cpu")
    run = torch.randn(1, 2, 2, 6, d).to(torch.bfloat16)
    kv.set_prefixes([[(run, 4)]] * 2)
    kv.begin(0, torch.tensor([[True] * 5, [True] * 3 + [False] * 2]))
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, h, 5, d).to(torch.bfloat16) for h in (4, 2, 2))
    out = kv.attend(0, q, k, v, 1 / math.sqrt(d))
    assert out.dtype == torch.bfloat16 and isinstance(kv._flash, torch.Tensor)


@NEEDS_KERNEL
def test_rows_dropped_inside_a_forward_leave_the_flash_mask_of_the_rows_kept():
    """CGEE drops rows between layers (`select`): the next layer's flash mask is the kept rows'
    (a mask made for the whole batch would not fit them), and their outputs are unchanged."""
    d = 8
    torch.manual_seed(1)
    kv = BatchKV(2, 3, 2, d, 6, torch.float32, "cpu")
    kv.begin(0, torch.tensor([[True] * 6, [True] * 4 + [False] * 2, [True] * 5 + [False]]))
    q, k, v = (torch.randn(3, h, 6, d) for h in (4, 2, 2))
    whole = kv.attend(0, q, k, v, 1 / math.sqrt(d))
    kv.select([2, 0])
    assert kv._flash is None
    out = kv.attend(1, q[[2, 0]], k[[2, 0]], v[[2, 0]], 1 / math.sqrt(d))
    assert isinstance(kv._flash, torch.Tensor) and kv._flash.shape[0] == 2
    assert torch.allclose(out[0, :5], whole[2, :5], atol=1e-6) and torch.allclose(out[1], whole[0], atol=1e-6)
