"""What one decode step's attention reads (`Plan`): the fast step's per-layer views of the batch's
buffer and of the cached prefix runs, sorted by who reads them (`treesearch.engine.decoder`)."""

from __future__ import annotations

from typing import Any

import torch

from treesearch.cache.attention import BatchKV
from treesearch.kernels.runs_kernel import RunTable


class Plan:
    """What one decode step's attention reads, as per-layer views made once per step (one `unbind`
    per tensor, not a select per layer): the new token's K/V slots, the buffer so far (K transposed),
    and the cached prefix runs sorted by who reads them. With attention "math" the runs every row
    reads (`shared`) join the buffer in one softmax (`_attend_joint` in the decoder). The runs a
    row reads apart from others (its own, and runs only some rows read) go:
    - with the compiled kernel (`kernel`, see `treesearch.kernels.runs_kernel`): into one table
      (`runs`), read in place in one call per layer and merged into that softmax;
    - else the runs of one row (`singles`) join the softmax, copied side by side into one padded
      block (`packed`) when that takes at most pack_bytes, else read in place row by row, and runs
      read by some rows (`parts`) are merged by log-sum-exp.
    With "flash" every run is a part."""

    def __init__(
        self,
        batch: BatchKV,
        write_pos: int,
        mask: torch.Tensor | None,
        pack_bytes: int = 0,
        attention: str = "math",
        kernel: Any = None,
        threads: int = 1,
    ) -> None:
        t = write_pos + 1
        bsz = batch.batch
        self.mask = mask  # [B, 1, 1, t] or None (every buffer position valid)
        self.k_new = batch.k[:, :, :, write_pos].unbind(0)  # L x [B, Hkv, d]
        self.v_new = batch.v[:, :, :, write_pos].unbind(0)
        self.k_buf = batch.k[:, :, :, :t].transpose(-1, -2).unbind(0)  # L x [B, Hkv, d, t]
        self.v_buf = batch.v[:, :, :, :t].unbind(0)  # L x [B, Hkv, t, d]
        self.shared: list[tuple] = []  # (L x K^T [Hkv, d, m], L x V [Hkv, m, d])
        # row -> [(L x K^T, L x V, m)] in context order; (None, None, m) when packed (below)
        self.singles: dict[int, list[tuple]] = {}
        self.parts: list[tuple] = []  # (L x K [1, Hkv, m, d], L x V, rows: None, an int or a tensor)
        self.runs: RunTable | None = None  # with the kernel: every run not all rows read
        self.kernel = kernel
        self.threads = threads  # the kernel's threads (the step's torch threads)
        self.packed: tuple | None = None  # (L x K^T [B, Hkv, d, S], L x V [B, Hkv, S, d], mask [B, 1, 1, S])
        apart = [(kv, used, rows) for kv, used, rows in batch.groups if rows is not None]
        if (
            attention == "math"
            and kernel is not None
            and apart
            and all(RunTable.fits(kv) for kv, *_ in apart)
        ):
            self.runs = RunTable(bsz, [(kv, used, rows.tolist()) for kv, used, rows in apart])
        else:
            self.kernel = None
        rids = [torch.arange(bsz)]
        own: dict[int, list[tuple]] = {}  # row -> [(K [L, Hkv, m, d], V, m)]
        for kv, used, rows in batch.groups:
            if self.runs is not None and rows is not None:
                continue  # read by the kernel
            k, v = kv[:, 0, :, :used], kv[:, 1, :, :used]  # [L, Hkv, m, d]
            if attention == "math" and (rows is None or rows.shape[0] == 1):
                if rows is None:
                    self.shared.append((k.transpose(-1, -2).unbind(0), v.unbind(0)))
                else:
                    own.setdefault(int(rows[0]), []).append((k, v, used))
                continue
            one = rows is not None and rows.shape[0] == 1
            self.parts.append(
                (
                    k.unsqueeze(1).unbind(0),
                    v.unsqueeze(1).unbind(0),
                    int(rows[0]) if one and rows is not None else rows,
                )
            )
            rids.append(torch.arange(bsz) if rows is None else rows)
        self.single_len = max((sum(r[2] for r in runs) for runs in own.values()), default=0)
        self.rid = torch.cat(rids)
        if (
            own and batch.nbytes // batch.k.shape[3] * self.single_len <= pack_bytes
        ):  # the buffer's bytes per position
            self.packed = _pack(own, bsz, self.single_len, batch.k)
            self.singles = {row: [(None, None, m) for _, _, m in runs] for row, runs in own.items()}
        else:
            self.singles = {
                row: [(rk.transpose(-1, -2).unbind(0), rv.unbind(0), m) for rk, rv, m in runs]
                for row, runs in own.items()
            }


def _pack(own: dict[int, list[tuple]], bsz: int, width: int, like: torch.Tensor) -> tuple:
    """Each row's own runs side by side in one zero-padded K/V block [L, B, Hkv, width, d], with the
    mask that hides the padding (-inf; a row with no runs of its own is all padding)."""
    num_layers, _, hkv, _, d = like.shape
    k = like.new_zeros(num_layers, bsz, hkv, width, d)
    v = torch.zeros_like(k)
    mask = like.new_full((bsz, 1, 1, width), float("-inf"))
    for row, runs in own.items():
        off = 0
        for rk, rv, m in runs:
            k[:, row, :, off : off + m] = rk
            v[:, row, :, off : off + m] = rv
            off += m
        mask[row, :, :, :off] = 0.0
    return k.transpose(-1, -2).unbind(0), v.unbind(0), mask
