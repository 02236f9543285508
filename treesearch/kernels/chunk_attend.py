"""The attention kernel's tables for a prompt chunk (prefill, scoring: each row's queries at
consecutive positions) and its call (`treesearch.kernels.attend_kernel`), read by
`treesearch.cache.attention`."""

from __future__ import annotations

from typing import Any

import torch

from treesearch.kernels.attend_kernel import StepRuns


def add_rows(runs: StepRuns, prefixes: list, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor) -> bool:
    """Each row b's context into runs: its prefix runs (kv [L, 2, Hkv, n, d], used), then its valid
    stretches of the buffer k/v [L, B, Hkv, cap, d] (valid [B, T]). False when some run is not
    one the kernel reads."""
    whole = bool(valid.all())
    t = valid.shape[1]
    for b, prefix in enumerate(prefixes):
        for kv, used in prefix:
            if not StepRuns.fits(kv[:, 0], kv[:, 1]):
                return False
            runs.add(kv[:, 0], kv[:, 1], used, [b])
        kb, vb = k[:, b], v[:, b]  # [L, Hkv, cap, d]
        if not StepRuns.fits(kb, vb):
            return False
        if whole:
            runs.add(kb, vb, t, [b])
            continue
        flags = valid[b].tolist()  # padding (rows that finished, a prefill's shorter rows): skipped
        start = None
        for j, ok in enumerate([*flags, False]):
            if ok and start is None:
                start = j
            elif not ok and start is not None:
                runs.add(kb[:, :, start:], vb[:, :, start:], j - start, [b])
                start = None
    return True


def chunk_runs(
    prefixes: list, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor, write: int
) -> StepRuns | None:
    """The table of a prefill or scoring chunk over a padded buffer (`BatchKV`): k/v [L, B, Hkv,
    cap, d], valid [B, t] up to the chunk's end, its n = t - write new tokens per row at buffer
    positions write.. (each row's real ones first, then padding); query b n + j is row b's token
    j. None where the kernel cannot read it."""
    bsz, t = valid.shape
    n = t - write
    runs = StepRuns()
    if not add_rows(runs, prefixes, k, v, valid):
        return None
    lens = valid[:, write:].sum(1).tolist()
    before = valid[:, :write].sum(1).tolist()
    spans = []
    for b, (prefix, m, w) in enumerate(zip(prefixes, lens, before)):
        if m and not bool(valid[b, write : write + m].all()):
            return None  # padding before a real token: not a chunk this reads
        spans.append((b, b * n, m, sum(used for _, used in prefix) + w))
    runs.done(queries=bsz * n, spans=spans)
    return runs


def attend_chunk(
    fn: Any, runs: StepRuns, layer: int, q: torch.Tensor, hkv: int, scaling: float
) -> torch.Tensor:
    """A chunk's attention through the kernel: q [B, H, n, d] (the table's queries, b n + j; H =
    hkv g) -> [B, n, H, d] (a padding query's output 0). q times scaling first unless it is 1."""
    bsz, heads, n, d = q.shape
    g = heads // hkv
    qq = q.transpose(1, 2)  # [B, n, H, d]
    if scaling != 1.0:
        qq = qq * scaling
    # query b n + j at b n + j times one stride; torch calls a tensor contiguous whatever the stride
    # of a dimension of size 1, so with one query a row that stride is the rows' own
    if not (qq.stride(3) == 1 and (qq.stride(2) == d or heads == 1)) or (
        n > 1 and bsz > 1 and qq.stride(0) != n * qq.stride(1)
    ):
        qq = qq.contiguous()
    step = qq.stride(0) if n == 1 else qq.stride(1)
    flat = torch.as_strided(qq, (bsz * n, hkv, g, d), (step, g * d, d, 1), qq.storage_offset())
    out = qq.new_empty(bsz * n, hkv, g, d)
    runs.attend(fn, layer, flat, out, torch.get_num_threads())
    return out.view(bsz, n, heads, d)
