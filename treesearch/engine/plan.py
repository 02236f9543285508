"""One step of the local engine as plain data: what the scheduler decided (`Scheduler.schedule`),
before any forward. The runner (`treesearch.engine.runner.Runner`) executes it, then the scheduler
applies what came out (sampling, sealing, leaving, delivering).

Every byte a plan's forwards write was allocated while planning (the store's all-or-none
`KVStore.open_rows`: score rows' segments, an admitted row's fill, first decode chunk and token
of the decode step's buffer, ASKS's pre-pass), counting the evicted parts of every chain the
step reads (`reads`), which the runner recomputes first, as ordinary uncached prefill into open
segments of their own. So running a plan never asks whether something fits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from treesearch.cache.kvstore import Chain, Segment
from treesearch.cache.manager import Row
from treesearch.common.stats import Stats
from treesearch.engine.running import GenRow, ScoreRow
from treesearch.policies.asks import Pair


@dataclass(eq=False)
class ScoreBatch:
    """Score rows run together: their rows (looked up), each row's open segment for its new
    tokens and one for the tails of multi-token labels (`tails`, None when no label has one)."""

    items: list[ScoreRow]
    rows: list[Row]
    segs: list[Segment]
    tails: Segment | None
    labels: list[str]
    seqs: list[list[int]]
    rule: Any  # the exit rule (CGEE) or None


@dataclass(eq=False)
class AsksPass:
    """ASKS's pre-pass over rows of one batch (`treesearch.policies.asks.plan_pass`): each row in
    `order` computed up to `ends[i]` into its open segment; its rows wait for the next step,
    where they find the pre-pass's K/V (and the attached suffixes) cached."""

    items: list[GenRow | ScoreRow]
    rows: list[Row]
    pairs: list[Pair]
    order: list[int]
    ends: dict[int, int]
    segs: list[Segment]


@dataclass(eq=False)
class Part:
    """The next `n` uncached tokens of an admitted row's context, prefilled into its fill."""

    row: GenRow
    n: int


@dataclass(eq=False)
class StepPlan:
    """One step, decided: score batches, ASKS's pre-passes, the chains the step reads (their evicted
    parts recomputed first), prefill parts, the rows that decode and those preempted."""

    scores: list[ScoreBatch] = field(default_factory=list)
    asks: list[AsksPass] = field(default_factory=list)
    reads: list[tuple[Chain, Stats | None]] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)
    decode: list[GenRow] = field(default_factory=list)
    preempted: list[GenRow] = field(default_factory=list)
    followers: list[tuple[Any, Any]] = field(default_factory=list)  # (row that waits, row computing its run)

    def chains(self) -> list[Chain]:
        """Every chain the step reads (the store counts their evicted parts as room they take)."""
        return [c for c, _ in self.reads]

    def holds(self) -> bool:
        """Whether the plan already holds room (its score batches' or pre-passes' segments)."""
        return bool(self.scores or self.asks)
