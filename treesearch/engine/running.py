"""The work items the scheduler (`treesearch.engine.scheduler`) runs: a call of one search, its
generate rows while they run (tokens so far, own sampler, own K/V) and its score rows.

A generate row's own K/V lives in the store (`treesearch.cache.kvstore`, note 8) from admission:
its *fill*, an open segment of its uncached context tokens, which the prefill forwards write in
place (a long prompt over several steps, each step's part after the last) and which is sealed into
the token tree where it is when the prompt is in (then it is part of the chain the row pins and
reads); and its decode chunks, open segments its decode steps write (`RowMemory.regrow` copies
them into one), sealed where they are when it ends. So a row that joins a running batch later
attends over its cached chain (its sealed prompt included), then its unsealed fill, then its
decode chunks, exactly the context it would have alone.
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
    fill: Segment | None = None  # open segment of its uncached context tokens, until sealed in the tree
    filled: int = 0  # of the context's uncached tokens, those prefilled so far at this admission
    chunks: list[Segment] = field(default_factory=list)  # its open segments in the store, in order
    step_bytes: int = 0  # its token of a decode step's buffer, held from admission on
    pinned: list = field(default_factory=list)  # the chain it attends over, pinned while it runs
    handle: Handle | None = None  # where its prompt (then prompt + fed tokens) ends in the store
    reused: bool = False  # its reuse was counted (at its first admission)
    asks_ref: int | None = None
    asks_sigma: float | None = None
    waited: bool = False  # it waited a step for a shared run or ASKS's pre-pass (never again)
    after: GenRow | None = None  # the row computing the run it shares, until that row's prompt is in
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
        """Its own K/V after the pinned chain, as prefix runs: its fill (unsealed), its chunks."""
        segs = ([self.fill] if self.fill is not None else []) + self.chunks
        return [(s.kv, s.used) for s in segs if s.used]

    def own_start(self) -> int:
        """Absolute position of the first token of its own K/V (`own_runs`)."""
        assert self.plan is not None
        return self.plan.matched if self.fill is not None else len(self.plan.ids)

    def todo(self) -> int:
        """Uncached tokens of its admitted context still to prefill (0: it decodes)."""
        assert self.plan is not None
        return len(self.plan.ids) - self.plan.matched - self.filled

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
        """A copy of its own K/V from absolute position start (>= `own_start`) to what it holds."""
        parts = [kv[:, :, :, :used] for kv, used in self.own_runs()]
        return torch.cat(parts, dim=3)[:, :, :, start - self.own_start() :].clone()


@dataclass(eq=False)
class ScoreRow:
    """One score row: the prompt's cache plan and its owner."""

    call: Call
    index: int
    row: Row
    owner: Hashable = None
    waited: bool = False  # it waited a step for a shared run or ASKS's pre-pass (never again)

    @property
    def stats(self) -> Stats:
        assert self.row.stats is not None
        return self.row.stats
