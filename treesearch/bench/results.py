"""What one timed run of a workload records (`RunResult`), shared by every workload, the runner
and the report: its counters, its decisions (strings compared position by position across
modes), per-item correctness, and the generation requests it issued (prompts batched as issued)
so that `hf-cb` can replay exactly those."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Tick = Callable[[int], None]
FIXED_LENGTH_NOTE = (
    "fixed lengths: EOS and stop strings ignored (dummy weights, or --fixed-length); "
    "timings only, accuracy and decisions mean nothing"
)
SUM_FIELDS = (
    "prefill_tokens",
    "reused_tokens",
    "decode_tokens",
    "unique_tokens",
    "generated_tokens",
    "model_calls",
    "generate_calls",
    "score_calls",
    "verify_calls",
    "verify_skipped",
    "verify_layers_run",
    "verify_layers_full",
    "cgee_disagreements",
    "asks_attached",
    "asks_extra_reused",
    "evicted_blocks",
    "recomputed_tokens",
    "preemptions",
)
BATCH_FIELDS = ("decode_steps", "decode_rows", "short_steps")  # the local engine scheduler's batch fill


@dataclass
class RunResult:
    """One timed run of a workload in one mode."""

    wall_s: float = 0.0
    verify_s: float = 0.0  # of wall_s, the time spent verifying (scoring) branches: Stats.verify_s summed
    stats: dict = field(default_factory=dict)
    decisions: list[str] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)
    requests: list[list[list[str]]] = field(default_factory=list)  # item -> generate call -> prompts
    max_new_tokens: int = 0
    notes: list[str] = field(default_factory=list)
    # the scheduler's batch fill over the run (BATCH_FIELDS; empty for workloads and backends without one):
    # kept apart from `stats` because it depends on thread timing and need not repeat exactly
    batch: dict = field(default_factory=dict)
    server: dict | None = None  # server mode: client times over the run (`bench.engines.timed_run`)
    # local engine: seconds inside model forwards over the run and their count (`Forward.busy_s`,
    # `Forward.forwards`); the rest of wall_s is the engine's own time (None: not counted)
    forward_s: float | None = None
    forwards: int | None = None

    def add_stats(self, stats: dict) -> None:
        """Sum counters over items; peak KV is the maximum (each item's search counts its own). The
        verification time goes to `verify_s`, not into the counters (which must repeat exactly)."""
        self.verify_s += float(stats.get("verify_s", 0.0) or 0.0)
        for k in SUM_FIELDS:
            self.stats[k] = self.stats.get(k, 0) + int(stats.get(k, 0) or 0)
        for k in ("peak_kv_bytes", "least_budget_bytes"):
            self.stats[k] = max(self.stats.get(k, 0), int(stats.get(k, 0) or 0))

    def add_batch(self, schedulers: list) -> None:
        """Sum the batch-fill counters of the schedulers the run's engines used (each once)."""
        for k in BATCH_FIELDS:
            self.batch[k] = sum(int(getattr(s, k, 0)) for s in schedulers)

    def add_forwards(self, forwards: list) -> None:
        """The time inside the model forwards of the run's engines (`Forward.busy_s`, each engine
        built during the run and counted once) and their number."""
        self.forward_s = sum(float(f.busy_s) for f in forwards)
        self.forwards = sum(int(f.forwards) for f in forwards)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
