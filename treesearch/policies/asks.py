"""ASKS: attach a branch to a reference branch's K/V when their hidden states say they mean the same.

What "attach" means here (sound by construction, lossy only where the gate allows):
two prompts of one batch, a *branch* and its *reference* (an earlier row of the same call), have
the same length and differ only in a span: ids = P + span + S with a common prefix P and a common
suffix S (|S| >= 2), the spans of equal length, so every suffix token has the same position in
both. Exact sharing already serves P. The reference computes span + S as usual; the branch
computes its own span, and then, if the gate opens, takes the reference's K/V for S[:-1] instead
of computing it (its last token is always computed: its logits start the branch's decoding or
scoring). Those K/V were computed attending to the reference's span, not the branch's: that is
the approximation, and the only one. The branch's own span, its last token and everything after
are computed exactly over the attached K/V.

Gate (no extra forward pass: the spans are computed anyway, in one pre-pass over the batch):

    sigma = sum_l w_l cos(h_l(branch), h_l(ref)) / sum_l w_l,   w_l = exp(alpha * l / L)

with h_l the output of decoder layer l (l = 1..L) mean-pooled over the span positions each row
computed in this pass. alpha > 0 weights deep layers (meaning) over shallow ones (surface form).
sigma >= tau attaches. Identical spans give sigma = 1, but identical prompts never get here: they
take the exact path (prefix lookup) first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from treesearch.common.errors import CacheBudgetError


@dataclass(frozen=True)
class Pair:
    """Row `row` may attach to row `ref`: common prefix of `prefix` tokens, suffix of `suffix`."""

    row: int
    ref: int
    prefix: int
    suffix: int

    def span(self, length: int) -> tuple[int, int]:
        """[start, end) of the differing span (absolute token positions)."""
        return self.prefix, length - self.suffix


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _lcs(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[-1 - i] == b[-1 - i]:
        i += 1
    return i


def pair_rows(
    ids: Sequence[Sequence[int]],
    matched: Sequence[int],
    min_suffix: int = 2,
    groups: Sequence[Any] | None = None,
) -> list[Pair]:
    """For each row, the earlier non-candidate row it could attach to (longest common suffix,
    then earliest). Both rows must compute part of the span in this call (not all cached).
    groups[i]: row i pairs only with rows of its own group (the rows of one search, so that a
    search's result never depends on the searches batched with it)."""
    pairs: list[Pair] = []
    refs: list[int] = []
    for i, a in enumerate(ids):
        best: Pair | None = None
        for j in refs:
            b = ids[j]
            if len(b) != len(a) or a == b or (groups is not None and groups[i] != groups[j]):
                continue
            s = _lcs(a, b)
            p = _lcp(a, b)
            end = len(a) - s
            if s < min_suffix or p >= end or matched[i] >= end or matched[j] >= end:
                continue
            if best is None or s > best.suffix:
                best = Pair(row=i, ref=j, prefix=p, suffix=s)
        if best is None:
            refs.append(i)
        else:
            pairs.append(best)
    return pairs


def layer_weights(num_layers: int, alpha: float) -> torch.Tensor:
    """w_l = exp(alpha * l / L) for l = 1..L."""
    ls = torch.arange(1, num_layers + 1, dtype=torch.float64)
    return torch.exp(alpha * ls / num_layers)


def layer_cosines(h_branch: torch.Tensor, h_ref: torch.Tensor) -> list[float]:
    """cos(h_l(branch), h_l(ref)) for each layer; h_* are [L, hidden] (pooled)."""
    assert h_branch.shape == h_ref.shape, (
        f"hidden shapes differ: {tuple(h_branch.shape)} vs {tuple(h_ref.shape)}"
    )
    return torch.nn.functional.cosine_similarity(h_branch.double(), h_ref.double(), dim=-1).tolist()


def sigma_from_cosines(cos: Sequence[float], alpha: float) -> float:
    """sum_l w_l cos_l / sum_l w_l (so a calibration can try many alphas on logged cosines)."""
    c = torch.tensor(cos, dtype=torch.float64)
    w = layer_weights(len(cos), alpha)
    value = float((w * c).sum() / w.sum())
    return 1.0 if math.isclose(value, 1.0, abs_tol=1e-12) else value


def sigma(h_branch: torch.Tensor, h_ref: torch.Tensor, alpha: float) -> float:
    """Weighted mean over layers of cos(h_l(branch), h_l(ref)); h_* are [L, hidden] (pooled)."""
    return sigma_from_cosines(layer_cosines(h_branch, h_ref), alpha)


def pooled(hidden: Sequence[torch.Tensor], row: int, lo: int, hi: int) -> torch.Tensor:
    """Mean over positions [lo, hi) of one row of each layer's output -> [L, hidden]."""
    return torch.stack([h[row, lo:hi].float().mean(dim=0) for h in hidden])


class PrefixCache(Protocol):
    """What the gate needs of the cache after the pre-pass (the local engine hands its
    `treesearch.cache.manager.CacheManager`): insert an attached row's K/V after its context."""

    def insert(self, ids: list[int], start: int, kv: Any, *, charge: Any = None) -> Any: ...


def plan_pass(rows: list) -> tuple[list[Pair], list[int], dict[int, int]] | None:
    """Which rows of a batch the pre-pass computes, and how far: (pairs, order, ends), order the
    references then the candidates, each row i computed from its cached prefix up to ends[i] (a
    reference up to its last token, a candidate up to its common suffix); None when no row
    pairs. rows: `treesearch.cache.manager.Row`s already looked up. Planning only: the engine
    runs the pass (one forward capturing every layer's output) and then calls `Gate.decide`."""
    pairs = pair_rows([r.ids for r in rows], [r.matched for r in rows], groups=[r.search for r in rows])
    if not pairs:
        return None
    cand = {p.row: p for p in pairs}
    order = sorted({p.ref for p in pairs}) + sorted(cand)
    ends = {i: len(rows[i].ids) - (cand[i].suffix if i in cand else 1) for i in order}
    return pairs, order, ends


class Gate:
    """ASKS for one engine: the attach step and its records, every gate decision (`log`: sigma,
    attached, tokens reused) and which segment took its K/V from which (`refs`: segment id ->
    the reference context's segment id)."""

    def __init__(self, alpha: float, tau: float) -> None:
        self.alpha, self.tau = alpha, tau
        self.log: list[dict] = []
        self.refs: dict[int, int] = {}

    def decide(
        self,
        rows: list,
        pairs: list[Pair],
        order: list[int],
        hidden: Sequence[torch.Tensor],
        kvs: Sequence[torch.Tensor],
        handles: dict[int, Any],
        cache: PrefixCache,
    ) -> None:
        """After the pre-pass (`plan_pass`): hidden, each layer's output [B, n, hidden] over the
        rows in `order`; kvs, their K/V [L, 2, Hkv, n, d] from their cached prefixes; handles,
        where each row's pre-pass context ends in the cache. A candidate whose gate opens takes
        the reference's K/V for its suffix (all but the last token), inserted after its own
        context; one whose context the cache could not keep resident, or for whose suffix it has
        no room, computes its own (not attached)."""
        at = {i: b for b, i in enumerate(order)}
        for p in pairs:
            r, f = rows[p.row], rows[p.ref]
            lo, hi = p.span(len(r.ids))
            hb = pooled(hidden, at[p.row], max(lo, r.matched) - r.matched, hi - r.matched)
            hr = pooled(hidden, at[p.ref], max(lo, f.matched) - f.matched, hi - f.matched)
            cos = layer_cosines(hb, hr)
            r.asks_sigma = sigma_from_cosines(cos, self.alpha)
            n = len(r.ids)
            attach = r.asks_sigma >= self.tau
            end = None
            own, used = handles[p.row]
            if attach and own.resident_len >= used:
                kv = kvs[at[p.ref]][:, :, :, hi - f.matched : n - 1 - f.matched]
                try:
                    end = cache.insert(r.ids[: n - 1], hi, kv, charge=r.stats)
                except CacheBudgetError:
                    end = None
            attach = end is not None
            self.log.append(
                {
                    "sigma": r.asks_sigma,
                    "attached": attach,
                    "tokens": n - 1 - hi,
                    "cos": cos,
                    "row": p.row,
                    "ref": p.ref,
                }
            )
            if end is None:
                continue
            self.refs[end[0].id] = handles[p.ref][0].id
            r.asks_ref = p.ref
            r.stats.asks_attached += 1
            r.stats.asks_extra_reused += n - 1 - hi
