"""A test-set run: its inputs, its JSONL results file (one line per input, appended and flushed as
each search finishes, so an interrupted run leaves a valid file that `resume` continues) and its
summary (accuracy with a 95% interval, inputs per hour, token totals).

A line: {"index", "input", "status" ("complete" | "failed" | "invalid"), "answer", "solved",
"tokens", "wall_s", "answer_node", "error", "stats", "worker", "strategy"}. `tokens` is the search's
cost in tokens run through the model (prefill + decode: prompt tokens whose K/V came from the cache
are not counted), `wall_s` its own wall time (searches run concurrently overlap), `strategy` its
strategy's settings ({"name": ..., fields...}). An input the task refuses (`Problem.check_input`)
is written as "invalid" with the error, without a search; a search that raises as "failed".
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from treesearch.common.errors import SaveFileError, TreeSearchError
from treesearch.common.intervals import wilson

TOKEN_COUNTERS = ("prefill_tokens", "reused_tokens", "decode_tokens", "generated_tokens", "recomputed_tokens")


def task_rows(task: str) -> list[Any]:
    """Every row of a built-in task's shipped test set, as inputs its Problem takes
    (Game of 24: "a b c d"; GSM8K: {"question", "answer"}, so the answer can be checked;
    Countdown: {"target", "numbers"}, rows 0-199 of 3 numbers, 200-399 of 4, 400-599 of 5)."""
    if task == "game24":
        from treesearch.tasks.game24 import load_puzzles

        return load_puzzles(0, None)
    if task == "gsm8k":
        from treesearch.tasks.datasets import load_gsm8k

        return [{"question": q.question, "answer": q.solution} for q in load_gsm8k()]
    if task == "countdown":
        from treesearch.tasks.countdown import load_instances

        return [{"target": r["target"], "numbers": r["numbers"]} for r in load_instances()]
    raise TreeSearchError(f"task {task!r} has no shipped test set; give the inputs with --inputs FILE")


def task_inputs(task: str, start: int, end: int | None) -> list[Any]:
    """Rows [start, end) of a built-in task's shipped test set (fewer where the set ends first)."""
    return task_rows(task)[start:end]


def file_inputs(path: str | Path) -> list[Any]:
    """Inputs from a file: one per line (blank lines skipped); a .jsonl file holds one JSON value per
    line, and a line that is not one is refused naming its line number in the file."""
    lines = [(n, ln) for n, ln in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1)]
    lines = [(n, ln) for n, ln in lines if ln.strip()]
    if not str(path).endswith(".jsonl"):
        return [ln for _, ln in lines]
    out = []
    for n, ln in lines:
        try:
            out.append(json.loads(ln))
        except json.JSONDecodeError as err:
            raise SaveFileError(
                f"{path} line {n}: not a JSON value ({err.msg}); write one JSON value per line"
            ) from None
    return out


def plural(n: int, word: str) -> str:
    """The count with its noun: plural(1, "input") is "1 input", plural(2, "input") "2 inputs"."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def record(
    index: int,
    x: Any,
    result: Any = None,
    *,
    error: str | None = None,
    worker: Any = None,
    strategy: dict | None = None,
) -> dict:
    """The JSON line of one input: its search's result and cost, or the error that kept it from
    running."""
    if result is None:
        return {
            "index": index,
            "input": x,
            "status": "invalid",
            "answer": None,
            "solved": False,
            "tokens": 0,
            "wall_s": 0.0,
            "answer_node": None,
            "error": error,
            "stats": {},
            "worker": worker,
            "strategy": strategy,
        }
    stats = dict(result.stats)
    return {
        "index": index,
        "input": x,
        "status": result.status,
        "answer": result.answer,
        "solved": bool(result.solved),
        "tokens": int(stats.get("prefill_tokens", 0)) + int(stats.get("decode_tokens", 0)),
        "wall_s": round(float(stats.get("wall_s", 0.0)), 3),
        "answer_node": result.answer_node,
        "error": result.error,
        "stats": stats,
        "worker": worker,
        "strategy": strategy,
    }


def strategy_record(strategy: Any) -> dict | None:
    """A strategy's settings for the results file: {"name": class name, field: value...}."""
    if strategy is None:
        return None
    from treesearch.search.resuming import describe

    settings = describe(strategy)
    return {"name": type(strategy).__name__, **(settings if isinstance(settings, dict) else {})}


def row_tokens(row: dict) -> int:
    """A line's tokens (prefill + decode), from its stats for files written before the field."""
    if "tokens" in row:
        return int(row["tokens"])
    stats = row.get("stats") or {}
    return int(stats.get("prefill_tokens", 0)) + int(stats.get("decode_tokens", 0))


def row_seconds(row: dict) -> float:
    """A line's search wall time, from its stats for files written before the field."""
    if "wall_s" in row:
        return float(row["wall_s"])
    return float((row.get("stats") or {}).get("wall_s", 0.0))


class ResultsFile:
    """The JSONL file of a run, opened for appending. With resume, the lines already there are
    kept (a half-written last line from a killed run is cut off) and their indexes are `done`."""

    def __init__(self, path: str | Path, *, resume: bool = False) -> None:
        self.path = Path(path)
        self.done: dict[int, dict] = {}
        if self.path.exists() and not resume and self.path.stat().st_size > 0:
            raise SaveFileError(
                f"{self.path} exists; pass --resume to continue that run, or choose another --out"
            )
        if resume and self.path.exists():
            self._read_existing()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")

    def _read_existing(self) -> None:
        raw = self.path.read_bytes()
        keep = raw[: raw.rfind(b"\n") + 1]  # a line is whole only with its newline
        for n, line in enumerate(keep.decode("utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                self.done[int(row["index"])] = row
            except (ValueError, KeyError, TypeError):
                raise SaveFileError(
                    f"{self.path} line {n} is not a result line; it is not a file this command "
                    "wrote, so --resume cannot continue it"
                ) from None
        if len(keep) < len(raw):
            with open(self.path, "r+b") as f:
                f.truncate(len(keep))

    def write(self, row: dict) -> None:
        """Append one line and flush it to the OS (written whole, or not at all before the newline)."""
        if row["index"] in self.done:
            raise SaveFileError(f"input {row['index']} is already in {self.path}")
        self._f.write(json.dumps(row, default=repr) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())
        self.done[row["index"]] = row

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> ResultsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Summary:
    """What a run found, over the lines of its file."""

    inputs: int = 0
    searched: int = 0  # inputs a search ran on (complete or failed): the accuracy's denominator
    solved: int = 0
    failed: int = 0
    invalid: int = 0
    accuracy: float = 0.0  # solved / searched (an invalid input is not searched)
    accuracy_low: float = 0.0  # 95% Wilson interval
    accuracy_high: float = 0.0
    wall_s: float = 0.0  # this session's wall time (a resumed run counts only what it ran)
    inputs_run: int = 0  # inputs this session ran
    inputs_per_hour: float = 0.0
    tokens: dict = field(default_factory=dict)
    tokens_per_problem: float = 0.0  # mean tokens (prefill + decode) of a searched input
    seconds_per_problem: float = 0.0  # mean wall time of a searched input's search
    per_worker: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        invalid = f", {self.invalid} invalid (not searched)" if self.invalid else ""
        out = [
            f"inputs: {self.inputs}{invalid}; searched {self.searched} ({self.failed} failed): solved "
            f"{self.solved} of {self.searched}, accuracy {self.accuracy:.3f} "
            f"(95% CI {self.accuracy_low:.3f}-{self.accuracy_high:.3f})",
            f"this run: {plural(self.inputs_run, 'input')} in {self.wall_s:.1f} s = "
            f"{self.inputs_per_hour:.1f} inputs/h",
            "tokens: " + ", ".join(f"{k}={v}" for k, v in self.tokens.items()),
            f"cost: {self.tokens_per_problem:.0f} tokens per problem (prefill + decode), "
            f"{self.seconds_per_problem:.2f} s per problem (each search's own wall time)",
        ]
        if len(self.per_worker) > 1:
            out.append("per worker: " + ", ".join(f"{k}: {v}" for k, v in sorted(self.per_worker.items())))
        return out


def summarize(rows: Iterable[dict], *, wall_s: float = 0.0, inputs_run: int = 0) -> Summary:
    rows = list(rows)
    s = Summary(inputs=len(rows), wall_s=wall_s, inputs_run=inputs_run)
    s.solved = sum(bool(r.get("solved")) for r in rows)
    s.failed = sum(r.get("status") == "failed" for r in rows)
    s.invalid = sum(r.get("status") == "invalid" for r in rows)
    s.searched = s.inputs - s.invalid
    s.accuracy = s.solved / s.searched if s.searched else 0.0
    s.accuracy_low, s.accuracy_high = wilson(s.solved, s.searched)
    s.inputs_per_hour = 3600 * inputs_run / wall_s if wall_s > 0 else 0.0
    s.tokens = {k: sum(int(r.get("stats", {}).get(k, 0)) for r in rows) for k in TOKEN_COUNTERS}
    searched = [r for r in rows if r.get("status") != "invalid"]
    if searched:
        s.tokens_per_problem = sum(row_tokens(r) for r in searched) / len(searched)
        s.seconds_per_problem = sum(row_seconds(r) for r in searched) / len(searched)
    for r in rows:
        if r.get("worker") is not None:
            s.per_worker[str(r["worker"])] = s.per_worker.get(str(r["worker"]), 0) + 1
    return s


def run_inputs(
    source: Any,
    items: list[tuple[int, Any]],
    out: ResultsFile,
    *,
    concurrency: int = 16,
    trees: str | Path | None = None,
    progress: bool = True,
) -> Summary:
    """Solve the (index, input) items not yet in `out`, writing each line as its search finishes;
    returns the summary over the whole file. Inputs the task refuses are written as invalid.
    source: a Searcher (its solve_many, `concurrency` at a time), or anything with `.problem` and
    `solve_items(items)` yielding (index, input, SearchResult) as each finishes (a
    `treesearch.runs.distributed.DistributedRun`, whose results carry the worker that ran them)."""
    todo = [(i, x) for i, x in items if i not in out.done]
    problem = source.problem
    spec = getattr(source, "spec", None)  # a DistributedRun's workers' settings
    strategy = strategy_record(getattr(source, "strategy", None) or getattr(spec, "strategy", None))
    valid = []
    for i, x in todo:
        try:
            problem.check_input(x)
            valid.append((i, x))
        except TreeSearchError as err:
            out.write(record(i, x, error=f"{type(err).__name__}: {err}", strategy=strategy))
    bar = _bar(progress, len(todo), len(todo) - len(valid))
    t0 = time.perf_counter()
    tokens = 0
    if hasattr(source, "solve_items"):
        results = source.solve_items(valid)
    else:
        results = (
            (i, x, r)
            for (i, x), r in zip(valid, source.solve_many([x for _, x in valid], concurrency=concurrency))
        )
    try:
        for i, x, res in results:
            worker = getattr(res, "worker", None)
            out.write(record(i, x, res, worker=worker, strategy=strategy))
            if trees is not None:
                Path(trees).mkdir(parents=True, exist_ok=True)
                res.tree.save(Path(trees) / f"{i}.json", problem.state_to_json)
            tokens += res.stats.get("prefill_tokens", 0) + res.stats.get("decode_tokens", 0)
            if bar is not None:
                bar.update(1)
                solved = sum(bool(r.get("solved")) for r in out.done.values())
                bar.set_postfix(solved=solved, tok_s=f"{tokens / max(time.perf_counter() - t0, 1e-9):.0f}")
    finally:
        if bar is not None:
            bar.close()
    wall = time.perf_counter() - t0
    ran = len(valid)
    return summarize(out.done.values(), wall_s=wall, inputs_run=ran)


def _bar(enabled: bool, total: int, initial: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="run", unit=" inputs")
