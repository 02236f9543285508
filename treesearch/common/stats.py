"""Counters of work done, reported as `SearchResult.stats` (see docs/development/architecture.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields


@dataclass
class Stats:
    """What the engine computed and what it reused.

    prefill_tokens: tokens run through the model as prompt input (recomputation included).
    reused_tokens: prompt tokens whose K/V came from the cache instead.
    decode_tokens: generated tokens fed back through the model.
    unique_tokens: distinct token positions in the union of all contexts the model saw.
    The physical limit is prefill_tokens + decode_tokens == unique_tokens (within one search that
    starts from an empty cache; a Searcher's later searches start from the last one's prompts).
    recomputed_tokens: prefill of tokens whose K/V had been computed before but was not cached
    when needed (evicted, or never kept under the budget); part of prefill_tokens.
    evicted_blocks: blocks of K/V dropped to stay under cache_budget.
    preemptions: running rows freed and requeued to make room (recomputed when readmitted).
    peak_kv_bytes: the most K/V held at once: the cache's blocks plus the running batches' own
    buffers (within cache_budget); peak_store_bytes: the store's alone (its cached blocks and the
    running rows' generated K/V, which the store holds from admission). With several
    searches on one engine, both are the engine's peaks while the search ran.
    least_budget_bytes: the largest minimum any call of the search had (one row's context and
    batch buffer, with the new blocks of its root prompt where it has one, as the cache stood); a
    smaller cache_budget stops the same search with CacheBudgetError, so it is where to start.
    merged_duplicates: children parsed from the generations whose state equals a sibling's
    (`Problem.state_key`), merged into it: greedy samples of one node repeat each other, so with
    samples_per_expand > 1 and temperature 0 they are all merged (node["merged"] counts them per node).
    label_floor_hits: labels scored by a server (`treesearch.backends.server`) whose first token was not in
    the server's top-k log-probabilities and got the floor probability instead.
    """

    prefill_tokens: int = 0
    reused_tokens: int = 0
    decode_tokens: int = 0
    unique_tokens: int = 0
    generated_tokens: int = 0
    model_calls: int = 0
    generate_calls: int = 0
    score_calls: int = 0
    verify_calls: int = 0
    verify_skipped: int = 0
    verify_layers_run: int = 0
    verify_layers_full: int = 0
    cgee_disagreements: int = 0
    asks_attached: int = 0
    asks_extra_reused: int = 0
    evicted_blocks: int = 0
    recomputed_tokens: int = 0
    preemptions: int = 0
    label_floor_hits: int = 0
    merged_duplicates: int = 0
    peak_kv_bytes: int = 0
    peak_store_bytes: int = 0
    least_budget_bytes: int = 0
    wall_s: float = 0.0
    verify_s: float = 0.0  # wall seconds spent in LM verification (valuation) calls, CGEE included

    def reset(self) -> None:
        """Zero every counter in place (the engine's parts share this one object)."""
        for f in fields(self):
            setattr(self, f.name, f.default)

    def as_dict(self) -> dict:
        return asdict(self)

    def reuse_ratio(self) -> float:
        """Fraction of prompt tokens served from cache."""
        total = self.prefill_tokens + self.reused_tokens
        return self.reused_tokens / total if total else 0.0


def distinct(charge: Sequence[Stats]) -> list[Stats]:
    """Each Stats object of a per-row list once, in first-seen order (the rows of one search share
    one Stats; a merged call of several searches has several)."""
    seen: dict[int, Stats] = {}
    for st in charge:
        seen.setdefault(id(st), st)
    return list(seen.values())


def per_row(n: int, stats: Stats | Sequence[Stats] | None, default: Stats) -> list[Stats]:
    """The Stats each of n prompts is counted in: one for all (default when None) or one per prompt."""
    if stats is None or isinstance(stats, Stats):
        return [stats or default] * n
    if len(stats) != n:
        raise ValueError(f"stats has {len(stats)} entries for {n} prompts; give one per prompt")
    return list(stats)
