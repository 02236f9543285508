"""Shared-prefix attention, registered with transformers' AttentionInterface as "treesearch".

A running batch (`BatchKV`) attends over two kinds of keys:
- cached prefix runs (tensors handed in by the caller; this module knows nothing of the cache):
  K/V read in place, one matmul per distinct (run, used) pair for all the rows that share it;
  no copy, whatever the batch size;
- the batch's own buffer: each row's new prompt tokens and generated tokens, causal.

The partial results are merged exactly with log-sum-exp weights (the Hydragen decomposition):
for key sets A and B with partial outputs o_A, o_B and log-normalisers l_A, l_B,
    softmax(q K^T) V over A u B = (e^{l_A} o_A + e^{l_B} o_B) / (e^{l_A} + e^{l_B}).
Grouped-query attention is handled by folding the query-group axis into the query rows, so
K/V heads are never repeated.

Called without a `ts_batch` keyword (e.g. by `model.generate`), the function is plain SDPA.
"""

from __future__ import annotations

from typing import Any

import torch

from treesearch.kernels import attend_kernel, chunk_attend

ATTN_NAME = "treesearch"

# A chunk's attention (prefill, scoring, the layer path's steps) through the compiled kernel of
# `treesearch.kernels.attend_kernel` where it builds: each query over its own keys in blocks of
# `attend_kernel.CHUNK` positions from its context's start, so that its result is the same bits
# whichever rows share the forward, however its context is cut into runs, and as the decode step
# computes it (batch invariance, issue 42). False (or where it cannot be built): torch's flash
# kernel over the padded chunk and a merge per cached run, `attend_chunk` below.
KERNEL = True


def kernel() -> Any:
    """The compiled attention kernel where `KERNEL` is on and it builds, else None."""
    return attend_kernel.load() if KERNEL else None


Prefix = list[tuple[torch.Tensor, int]]  # a row's cached K/V runs: (kv [L, 2, Hkv, n, d], tokens used)


class BatchKV:
    """K/V of one running batch: a per-row local buffer plus the cached prefix runs each row extends."""

    def __init__(
        self,
        num_layers: int,
        batch: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: Any,
    ) -> None:
        # one tensor [L, 2, B, Hkv, cap, d]; k and v are its halves [L, B, Hkv, cap, d], so a row's
        # buffer is a prefix run in place (`row_run`)
        self.kv: torch.Tensor | None = torch.zeros(
            num_layers, 2, batch, kv_heads, capacity, head_dim, dtype=dtype, device=device
        )
        self.k = self.kv[:, 0]
        self.v = self.kv[:, 1]
        self.valid = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        self.groups: list[tuple[Any, int, torch.Tensor | None]] = []
        self.prefixes: list[Prefix] = [[] for _ in range(batch)]  # each row's runs, in context order
        self._write = 0
        self._n = 0
        self._mask: torch.Tensor | None = None
        self._flash: torch.Tensor | bool | None = None

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def set_prefixes(self, prefixes: list[Prefix]) -> None:
        """Group rows by the cached K/V runs they attend over (`group_prefixes`)."""
        self.groups = group_prefixes(prefixes, self.k.device)
        self.prefixes = list(prefixes)

    def begin(self, write_pos: int, new_valid: torch.Tensor) -> None:
        """Prepare a forward whose n new tokens per row go to buffer positions write_pos..write_pos+n."""
        n = new_valid.shape[1]
        self.valid[:, write_pos : write_pos + n] = new_valid
        self._write, self._n = write_pos, n
        self._mask = causal_mask(self.valid[:, : write_pos + n], write_pos, n)
        self._flash = None  # made at the forward's first layer
        self._table: Any = None  # the kernel's table, made at the forward's first layer (False: none)

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float
    ) -> torch.Tensor:
        """q [B, H, n, d], k/v [B, Hkv, n, d] (new tokens, RoPE applied) -> output [B, n, H, d]."""
        n = q.shape[2]
        w, t = self._write, self._write + n
        self.k[layer, :, :, w:t] = k
        self.v[layer, :, :, w:t] = v
        assert self._mask is not None, "begin() sets the mask before a forward"
        fn = kernel() if q.dtype == torch.float32 and q.device.type == "cpu" else None
        if fn is not None:
            if self._table is None:
                made = chunk_attend.chunk_runs(self.prefixes, self.k, self.v, self.valid[:, :t], w)
                self._table = False if made is None else made
            if self._table is not False:
                return chunk_attend.attend_chunk(fn, self._table, layer, q, self.k.shape[2], scaling)
        if self._flash is None:
            self._flash = flash_mask(self._mask, w, q.dtype)
        ks, vs = self.k[layer, :, :, :t], self.v[layer, :, :, :t]
        return attend_chunk(q, ks, vs, self._mask, self._flash, self.groups, layer, scaling)

    def select(self, keep: list[int]) -> None:
        """Keep only these rows (in this order): used when rows finish generating."""
        idx = torch.tensor(keep, dtype=torch.long, device=self.k.device)
        self.kv = None  # k and v are copies from here on
        self.k = self.k.index_select(1, idx)
        self.v = self.v.index_select(1, idx)
        self.valid = self.valid.index_select(0, idx)
        if self._mask is not None:  # rows dropped inside a forward (CGEE per-row exit)
            self._mask = self._mask.index_select(0, idx)
            self._flash = None  # the flash kernel's mask is remade for the rows kept
        self.groups = select_groups(self.groups, keep, self.k.device)
        self.prefixes = [self.prefixes[j] for j in keep]
        self._table = None

    def row_run(self, row: int) -> torch.Tensor:
        """Row's whole buffer as a prefix run [L, 2, Hkv, cap, d], in place (no copy): a row that
        goes on decoding in another batch attends over it (`treesearch.engine.scheduler`)."""
        assert self.kv is not None, "row_run after select: the buffer was copied"
        return self.kv[:, :, row]

    def row_kv(self, row: int, start: int, end: int) -> torch.Tensor:
        """A row's buffer K/V at positions [start, end) as [L, 2, Hkv, end-start, d] (a copy)."""
        return torch.stack((self.k[:, row, :, start:end], self.v[:, row, :, start:end]), dim=1).clone()


Groups = list[tuple[Any, int, "torch.Tensor | None"]]  # (run kv, used, rows reading it; None: all)


def group_prefixes(prefixes: list[Prefix], device: Any) -> Groups:
    """Group rows by the cached K/V runs they attend over: prefixes[b] is row b's list of
    (kv [L, 2, Hkv, n, d], used) pairs, in context order; a run shared by several rows (the
    same tensor and length) is read once for all of them."""
    by_key: dict[tuple[int, int], tuple[torch.Tensor, int, list[int]]] = {}
    for row, prefix in enumerate(prefixes):
        for kv, used in prefix:
            assert kv is not None, "a prefix's K/V is missing: make it resident before attending"
            by_key.setdefault((id(kv), used), (kv, used, []))[2].append(row)
    b = len(prefixes)
    return [
        (kv, used, None if len(rows) == b else torch.tensor(rows, dtype=torch.long, device=device))
        for kv, used, rows in by_key.values()
    ]


def select_groups(groups: Groups, keep: list[int], device: Any) -> Groups:
    """The groups of a batch cut to the rows `keep` (in this order, renumbered from 0)."""
    remap = {old: new for new, old in enumerate(keep)}
    out: Groups = []
    for kv, used, rows in groups:
        if rows is None:  # every row attends over it; still true for the rows kept
            out.append((kv, used, None))
            continue
        kept = [remap[r] for r in rows.tolist() if r in remap]
        if kept:
            t = None if len(kept) == len(keep) else torch.tensor(kept, dtype=torch.long, device=device)
            out.append((kv, used, t))
    return out


def causal_mask(keys: torch.Tensor, write_pos: int, n: int) -> torch.Tensor:
    """Which keys each of n new queries per row sees: keys [B, T] (valid buffer positions, the
    new ones at write_pos..write_pos+n) -> [B, n, T], causal among the new."""
    t = keys.shape[1]
    if n == 1:
        return keys[:, None, :]
    qpos = write_pos + torch.arange(n, device=keys.device)
    causal = torch.arange(t, device=keys.device)[None, :] <= qpos[:, None]  # [n, T]
    return keys[:, None, :] & causal[None]  # [B, n, T]


def attend_chunk(
    q: torch.Tensor,
    ks: torch.Tensor,
    vs: torch.Tensor,
    mask: torch.Tensor,
    flash: torch.Tensor | bool,
    groups: Groups,
    layer: int,
    scaling: float,
) -> torch.Tensor:
    """q [B, H, n, d] over a chunk's own keys ks/vs [B, Hkv, T, d] (mask [B, n, T]; flash:
    `flash_mask`'s answer) and then each group's cached run, merged exactly -> [B, n, H, d]."""
    bsz, heads, n, d = q.shape
    hkv, t = ks.shape[1], ks.shape[2]
    g = heads // hkv
    qg = q.reshape(bsz, hkv, g * n, d)  # head h uses kv head h // g
    if flash is not False:
        out, lse = _flash_buffer(q, ks, vs, flash, scaling)
    else:
        m = mask[:, None, None].expand(bsz, 1, g, n, t).reshape(bsz, 1, g * n, t)
        scores = torch.matmul(qg, ks.transpose(-1, -2)) * scaling  # [B, Hkv, gn, T]
        scores = scores.masked_fill(~m, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # [B, Hkv, gn, 1]
        out = torch.matmul(torch.exp(scores - lse), vs)  # [B, Hkv, gn, d]
    for kv, used, rows in groups:
        out, lse = _merge_prefix(qg, out, lse, kv[layer, 0, :, :used], kv[layer, 1, :, :used], rows, scaling)
    return out.reshape(bsz, heads, n, d).transpose(1, 2)


def flash_mask(mask: torch.Tensor, write: int, dtype: torch.dtype) -> torch.Tensor | bool:
    """How a chunk of n > 1 queries per row reads the buffer through SDPA's CPU flash kernel:
    True for plain causal (every key valid and the chunk starts the buffer: the kernel skips the
    blocks above the diagonal), else the additive mask [B, 1, n, T] (0 or -inf); False (the
    matmul path) for a single query per row, where a row's query sees no valid key, and where the
    kernel is not there."""
    n = mask.shape[1]
    if (
        n == 1
        or mask.device.type != "cpu"
        or not hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
    ):
        return False
    if not bool(mask.any(-1).all()):
        return False
    if write == 0 and bool(mask.all(0).equal(torch.ones(n, n, dtype=torch.bool).tril_())):
        return True
    return torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, float("-inf"))[:, None]


def _flash_buffer(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, how: torch.Tensor | bool, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [B, H, n, d] over the buffer's k/v [B, Hkv, T, d] by the flash kernel (K/V
    heads repeated for their query groups) -> (out [B, Hkv, g n, d], lse [B, Hkv, g n, 1]) in the
    folded layout of the matmul path."""
    bsz, heads, n, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    g = heads // hkv
    if g > 1:
        k = k[:, :, None].expand(bsz, hkv, g, t, d).reshape(bsz, heads, t, d)
        v = v[:, :, None].expand(bsz, hkv, g, t, d).reshape(bsz, heads, t, d)
    causal = how is True
    mask = None if isinstance(how, bool) else how
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, attn_mask=mask, scale=scaling
    )
    # the kernel's lse is float32 whatever q's dtype: the merge below stays in q's dtype, as the matmul path
    return out.reshape(bsz, hkv, g * n, d), lse.to(q.dtype).reshape(bsz, hkv, g * n, 1)


def _merge_prefix(qg, out, lse, ks, vs, rows, scaling):
    """Attend rows' queries over one cached K/V run [Hkv, m, d] and merge into (out, lse)."""
    q = qg if rows is None else qg.index_select(0, rows)  # [r, Hkv, gn, d]
    r, hkv, gn, d = q.shape
    qh = q.transpose(0, 1).reshape(hkv, r * gn, d)
    s = torch.matmul(qh, ks.transpose(-1, -2)) * scaling  # [Hkv, r*gn, m]
    l2 = torch.logsumexp(s, dim=-1, keepdim=True)
    o2 = torch.matmul(torch.exp(s - l2), vs)  # [Hkv, r*gn, d]
    o2 = o2.reshape(hkv, r, gn, d).transpose(0, 1)
    l2 = l2.reshape(hkv, r, gn, 1).transpose(0, 1)
    la = lse if rows is None else lse.index_select(0, rows)
    oa = out if rows is None else out.index_select(0, rows)
    m = torch.maximum(la, l2)
    wa, wb = torch.exp(la - m), torch.exp(l2 - m)
    tot = wa + wb
    merged = (oa * wa + o2 * wb) / tot
    new_lse = m + torch.log(tot)
    if rows is None:
        return merged, new_lse
    out = out.index_copy(0, rows, merged)
    lse = lse.index_copy(0, rows, new_lse)
    return out, lse


def treesearch_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """AttentionInterface entry: shared-prefix attention when a BatchKV is passed, else SDPA."""
    batch: BatchKV | None = kwargs.pop("ts_batch", None)
    if batch is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    if kwargs.get("sliding_window") is not None:  # Qwen2/Mistral layers pass their window, or None
        raise ValueError(
            "shared-prefix attention reads the whole context; a model with sliding-window layers "
            f"(window {kwargs['sliding_window']}) is not supported"
        )
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    return batch.attend(module.layer_idx, query, key, value, scaling), None


def install(model) -> None:
    """Register the attention function and switch the model to it (SDPA is kept as the fallback)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_NAME, treesearch_attention)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
    model.set_attn_implementation(ATTN_NAME)
