"""The work items the scheduler (`treesearch.engine.scheduler`) runs: a call of one search, its
generate rows while they run (tokens so far, own sampler, own K/V) and its score rows.

A generate row's own K/V: its prompt parts (the rows prefilled in one forward, a cohort, share one
`BatchKV`, the one staging buffer, counted against the budget until its last row leaves; row b's
part is a prefix run read in place; a long prompt is prefilled in several parts, one per step)
and, from admission, its open segments in the store (`treesearch.cache.kvstore`, note 8), which
its decode steps write (`RowMemory.regrow` copies them, with its parts where it is their cohort's
last reader, into one) and which are sealed where they are when it ends. So a row that joins a
running batch later attends over its cached chain, then its prompt parts, then its open
segments, exactly the context it would have alone.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import astuple, dataclass, field
from typing import Any

import torch

from treesearch.cache.kvstore import Segment
from treesearch.cache.manager import Handle, Row
from treesearch.common.config import Sampling
from treesearch.common.stats import Stats


@dataclass(eq=False)
class Call:
    """One generate or score call of one search: its items, and its results as they come."""

    kind: str  # "generate" | "score"
    n: int  # rows
    charge: list[Stats] = field(default_factory=list)  # where each row's work is counted
    key: Hashable = None  # score calls with equal keys share a forward
    args: dict = field(default_factory=dict)  # score: labels, seqs, exit_rule
    results: list = field(default_factory=list)
    left: int = 0
    error: BaseException | None = None
    cancelled: BaseException | None = None
    done: bool = False
    wake: Any = None  # the condition its waiting thread sleeps on (`Scheduler.submit`)
    counted: bool = False  # woken and counted in at the engine's door (`treesearch.engine.door`)

    def __post_init__(self) -> None:
        self.results = [None] * self.n
        self.left = self.n

    def deliver(self, index: int, result: Any) -> None:
        assert self.results[index] is None, f"row {index} of a call returned twice"
        self.results[index] = result
        self.left -= 1


@dataclass(eq=False)
class Cohort:
    """The rows prefilled by one forward: their buffer (`BatchKV`), held until the last leaves."""

    batch: Any
    nbytes: int  # counted against the budget while any row of it runs
    live: int


@dataclass(eq=False)
class GenRow:
    """One generate row: its prompt's cache plan, sampler, tokens so far and its own K/V."""

    call: Call
    index: int  # in its call
    prompt: str
    row: Row  # the prompt as the cache planned it at submission
    sampling: Sampling
    generator: torch.Generator
    owner: Hashable = None
    order: int = 0  # admission order (LRU preemption takes the latest)
    gens: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    finish: str | None = None
    plan: Row | None = (
        None  # the context computed at the current admission (prompt, + fed tokens on a resume)
    )
    parts: list[tuple[Cohort, int, int]] = field(default_factory=list)  # (cohort, its row there, tokens)
    filled: int = 0  # of the context's uncached tokens, those prefilled so far at this admission
    fill_bytes: int = 0  # reserved for the uncached tokens not prefilled yet
    chunks: list[Segment] = field(default_factory=list)  # its open segments in the store, in order
    step_bytes: int = 0  # its token of a decode step's buffer, held from admission on
    pinned: list = field(default_factory=list)  # the chain it attends over, pinned while it runs
    handle: Handle | None = None  # where its prompt (then prompt + fed tokens) ends in the store
    reused: bool = False  # its reuse was counted (at its first admission)
    asks_ref: int | None = None
    asks_sigma: float | None = None

    reused_n: int = 0  # prompt tokens served from the cache at its first admission

    @property
    def stats(self) -> Stats:
        assert self.row.stats is not None  # the engine's rows always carry their search's Stats
        return self.row.stats

    @property
    def context(self) -> list[int]:
        return self.row.ids + self.gens

    def sampling_key(self) -> tuple:
        return astuple(self.sampling)

    def own_runs(self) -> list[tuple[torch.Tensor, int]]:
        """Its own K/V after the cached chain, as prefix runs: the prompt parts, then the chunks."""
        runs = [(c.batch.row_run(slot), n) for c, slot, n in self.parts]
        return runs + [(s.kv, s.used) for s in self.chunks if s.used]

    def todo(self) -> int:
        """Uncached tokens of its admitted context still to prefill (0: it decodes)."""
        assert self.plan is not None
        return len(self.plan.ids) - self.plan.matched - self.filled

    def prompt_kv(self) -> torch.Tensor:
        """A copy of the K/V of its prefilled context tokens (its parts, in order)."""
        kvs = [c.batch.row_kv(slot, 0, n) for c, slot, n in self.parts]
        return kvs[0] if len(kvs) == 1 else torch.cat(kvs, dim=3)

    def room(self) -> int:
        """Free token slots in its last open segment."""
        return self.chunks[-1].kv.shape[3] - self.chunks[-1].used if self.chunks else 0

    def write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append one token's K/V ([L, Hkv, d] each) to its last open segment."""
        seg = self.chunks[-1]
        seg.kv[:, 0, :, seg.used] = k
        seg.kv[:, 1, :, seg.used] = v
        seg.used += 1

    def own_kv(self, start: int) -> torch.Tensor:
        """A copy of its own K/V from absolute position start (>= plan.matched) to what it holds."""
        assert self.plan is not None
        parts = [kv[:, :, :, :used] for kv, used in self.own_runs()]
        return torch.cat(parts, dim=3)[:, :, :, start - self.plan.matched :].clone()


@dataclass(eq=False)
class ScoreRow:
    """One score row: the prompt's cache plan and its owner."""

    call: Call
    index: int
    row: Row
    owner: Hashable = None

    @property
    def stats(self) -> Stats:
        assert self.row.stats is not None
        return self.row.stats
