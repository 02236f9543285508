"""Shared-prefix attention for a prefill whose rows write their new K/V straight into tensors
they own (`DirectKV`): a generate or score row's open segment in the store
(`treesearch.cache.kvstore`, note 8), handed in as a tensor and an offset; this module knows
nothing of the store.

Where `BatchKV` keeps a padded buffer for the batch and the caller copies each row's K/V out of
it, here each layer's new K/V [B, Hkv, n, d] is attended over as it comes out of the projection
(the chunk's own keys, causal, then the cached prefix runs, merged as `attention.attend_chunk`
does for `BatchKV`) and row b's n_b valid tokens are written to sinks[b] at its offset. The chunk's
keys are laid out as `BatchKV`'s buffer is when it holds exactly the chunk (contiguous [B, Hkv, n,
d]), so the attention's arithmetic is the same as a padded prefill's; only the home of the K/V
changes. A row's earlier chunks of the same prompt sit in front of the offset in its own tensor:
the caller passes them as a prefix run (kv, offset), which this forward reads and never writes.
"""

from __future__ import annotations

from typing import Any

import torch

from treesearch.cache.attention import (
    Prefix,
    attend_chunk,
    causal_mask,
    flash_mask,
    group_prefixes,
    kernel,
    select_groups,
)
from treesearch.kernels import chunk_attend
from treesearch.kernels.attend_kernel import StepRuns

Sink = tuple[torch.Tensor, int]  # a row's K/V home: (kv [L, 2, Hkv, capacity, d], first position to write)


class DirectKV:
    """A prefill batch whose rows' new K/V goes to their own tensors (`sinks`), no batch buffer."""

    def __init__(self, sinks: list[Sink], lens: list[int], device: Any) -> None:
        for (kv, off), n in zip(sinks, lens):
            assert off + n <= kv.shape[3], f"a sink of {kv.shape[3]} slots cannot take {n} tokens at {off}"
        self.sinks = sinks
        self.lens = lens
        self.device = device
        self.groups: list[tuple[Any, int, torch.Tensor | None]] = []
        self.prefixes: list[Prefix] = [[] for _ in sinks]
        self._mask: torch.Tensor | None = None
        self._flash: torch.Tensor | bool | None = None
        self._table: Any = None  # the attention kernel's table (`attention.KERNEL`; False: none)

    @property
    def batch(self) -> int:
        return len(self.sinks)

    def set_prefixes(self, prefixes: list[Prefix]) -> None:
        """Group rows by the cached K/V runs they attend over (`attention.group_prefixes`)."""
        self.groups = group_prefixes(prefixes, self.device)
        self.prefixes = list(prefixes)

    def begin(self, write_pos: int, new_valid: torch.Tensor) -> None:
        """Prepare the forward: new_valid [B, n] marks each row's real tokens (the rest padding)."""
        assert write_pos == 0, "a direct prefill's chunk starts its own keys"
        self._mask = causal_mask(new_valid, 0, new_valid.shape[1])
        self._flash = None  # made at the forward's first layer
        self._table = None

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float
    ) -> torch.Tensor:
        """q [B, H, n, d], k/v [B, Hkv, n, d] (new tokens, RoPE applied) -> output [B, n, H, d];
        row b's first lens[b] keys and values are written to its sink."""
        assert self._mask is not None, "begin() sets the mask before a forward"
        ks, vs = k.contiguous(), v.contiguous()  # [B, Hkv, n, d], as BatchKV's buffer of n slots
        for b, ((kv, off), n) in enumerate(zip(self.sinks, self.lens)):
            kv[layer, 0, :, off : off + n] = ks[b, :, :n]
            kv[layer, 1, :, off : off + n] = vs[b, :, :n]
        fn = kernel() if q.dtype == torch.float32 and q.device.type == "cpu" else None
        if fn is not None:
            if self._table is None:
                self._table = self._kernel_table(q.shape[2])
            if self._table is not False:
                return chunk_attend.attend_chunk(fn, self._table, layer, q, k.shape[1], scaling)
        if self._flash is None:
            self._flash = flash_mask(self._mask, 0, q.dtype)
        return attend_chunk(q, ks, vs, self._mask, self._flash, self.groups, layer, scaling)

    def _kernel_table(self, n: int) -> Any:
        """The kernel's table: each row's prefix runs, then its new keys in its sink; its queries
        b n + j at the positions after its prefix. False where the kernel cannot read a run."""
        runs = StepRuns()
        spans = []
        for b, (prefix, (kv, off), m) in enumerate(zip(self.prefixes, self.sinks, self.lens)):
            for pkv, used in prefix:
                if not StepRuns.fits(pkv[:, 0], pkv[:, 1]):
                    return False
                runs.add(pkv[:, 0], pkv[:, 1], used, [b])
            k, v = kv[:, 0, :, off:], kv[:, 1, :, off:]
            if not StepRuns.fits(k, v):
                return False
            runs.add(k, v, m, [b])
            spans.append((b, b * n, m, sum(used for _, used in prefix)))
        runs.done(queries=len(self.sinks) * n, spans=spans)
        return runs

    def select(self, keep: list[int]) -> None:
        """Keep only these rows (in this order) for the rest of the forward (CGEE's per-row exits,
        as `BatchKV.select`): the rows dropped write no more layers into their sinks."""
        assert self._mask is not None, "rows are dropped inside a forward"
        self.sinks = [self.sinks[j] for j in keep]
        self.lens = [self.lens[j] for j in keep]
        self._mask = self._mask.index_select(0, torch.tensor(keep, dtype=torch.long, device=self.device))
        self._flash = None  # remade for the rows kept
        self._table = None
        self.groups = select_groups(self.groups, keep, self.device)
        self.prefixes = [self.prefixes[j] for j in keep]
