"""The benchmark workloads: what one mode runs, and what it records (`RunResult`).

- game24: the ToT BFS (Searcher + Game24 + strategies.BFS(breadth=5)) on puzzles of 24.csv.
- branch: B sampled reasoning branches per question, each verified, score-weighted vote
  (`treesearch.bench.branch`).
- tree:   plan / execute / reflect, 3 branches per level, 27 leaves, majority vote on GSM8K
  (`treesearch.bench.fixed_tree`).
- paraphrase: each GSM8K question in k wordings (its facts reordered) before one long shared part,
  answered greedily and verified (`treesearch.bench.paraphrase`): where ASKS can share.
Each run records a `RunResult` (`treesearch.bench.results`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from treesearch.bench.branch import run_branch
from treesearch.bench.fixed_tree import run_tree
from treesearch.bench.modes import cgee_thresholds_note
from treesearch.bench.results import RunResult, Tick
from treesearch.common.config import RKSCConfig
from treesearch.common.errors import UsageError
from treesearch.models.load import LanguageModel


@dataclass
class Workload:
    """A named workload over a list of inputs; `run(lm, config, tick)` does one timed pass."""

    name: str
    task: str
    items: list[Any]
    runner: Callable[..., RunResult]
    options: dict = field(default_factory=dict)

    def run(
        self, lm: LanguageModel, config: RKSCConfig, tick: Tick | None = None, *, concurrency: int = 1
    ) -> RunResult:
        """One run over the items; concurrency > 1: that many searches at once (game24 only)."""
        extra = {"concurrency": concurrency} if concurrency > 1 else {}
        return self.runner(lm, config, self.items, tick or (lambda n: None), **self.options, **extra)


def run_game24(
    lm: LanguageModel,
    config: RKSCConfig,
    puzzles: list[str],
    tick: Tick,
    *,
    breadth: int = 5,
    seed: int = 0,
    max_new_tokens: int | None = None,
    concurrency: int = 1,
) -> RunResult:
    """ToT BFS per puzzle; decisions = the states kept at each depth, then the answer.
    concurrency > 1: the puzzles run `concurrency` at a time (`Searcher.solve_many`), timed as a whole."""
    from strategies import BFS
    from treesearch.search.searcher import Searcher
    from treesearch.tasks.game24 import Game24

    out = RunResult()
    if config.cgee:
        out.note(cgee_thresholds_note(config, lm.name, "game24"))
    problem = Game24() if max_new_tokens is None else Game24(max_new_tokens=max_new_tokens)
    out.max_new_tokens = problem.sampling.max_new_tokens
    # one Searcher for all puzzles: each search starts with the last one's prompt K/V (the templates)
    searcher = Searcher(lm, problem, BFS(breadth=breadth), config, seed=seed, progress=False)
    t0 = time.perf_counter()
    results = (
        searcher.solve_many(puzzles, concurrency=concurrency)
        if concurrency > 1
        else (searcher.solve(p) for p in puzzles)
    )
    schedulers: dict[int, Any] = {}  # the engines' schedulers (batch fill), each counted once
    forwards: dict[int, Any] = {}  # and their forwards (time inside the model), each built in this run
    for puzzle, result in zip(puzzles, results):
        sched = getattr(searcher.engine, "scheduler", None)  # a server backend has none
        if sched is not None:
            schedulers.setdefault(id(sched), sched)
        fwd = getattr(searcher.engine, "forward", None)
        if fwd is not None and hasattr(fwd, "busy_s"):
            forwards.setdefault(id(fwd), fwd)
        if result.status != "complete":  # a concurrent search that raised: raise it here, as solve would
            from treesearch.common.errors import CacheBudgetError

            kind = CacheBudgetError if (result.error or "").startswith("CacheBudgetError") else RuntimeError
            raise kind(f"puzzle {puzzle!r}: the search {result.status}: {result.error}")
        out.add_stats(result.stats)
        tree = result.tree
        by_depth: dict[int, list] = {}
        for n in tree.graph.nodes:
            by_depth.setdefault(tree.node(n)["depth"], []).append(n)
        batches = []
        for depth in sorted(by_depth):
            nodes = sorted(by_depth[depth])
            if depth > 0:
                kept = sorted(
                    problem.state_key(tree.node(n)["state"])
                    for n in nodes
                    if tree.node(n)["status"] != "pruned"
                )
                out.decisions.append(f"{puzzle}|depth {depth}|" + ";".join(kept))
            prompts = [
                problem.expand_prompt(tree.node(n)["state"])
                for n in nodes
                if "generations" in tree.node(n)
                for _ in range(max(1, problem.samples_per_expand))
            ]
            if prompts:
                batches.append(prompts)
        out.decisions.append(f"{puzzle}|answer|{result.answer}")
        out.correct.append(bool(result.solved))
        out.requests.append(batches)
        tick(1)
    out.wall_s = time.perf_counter() - t0
    if schedulers:
        out.add_batch(list(schedulers.values()))
    if forwards:
        out.add_forwards(list(forwards.values()))
    return out


def make_workload(
    name: str,
    task: str | None,
    start: int,
    end: int,
    *,
    branches: int = 8,
    seed: int = 0,
    max_new_tokens: int | None = None,
    ignore_eos: bool = False,
    wordings: int = 4,
) -> Workload:
    """The workload named on the command line, over input rows [start, end); max_new_tokens
    overrides the workload's generation lengths (None = the workload's own); ignore_eos makes every
    generation run its full length (branch and tree only: game24's search needs parsable text)."""
    from treesearch.tasks import datasets

    if name == "game24":
        from treesearch.tasks.game24 import load_puzzles

        if ignore_eos:
            raise UsageError(
                "game24 cannot run at fixed lengths (its search parses the model's text); "
                "with a dummy model use the branch or tree workload"
            )

        return Workload(
            "game24",
            "game24",
            load_puzzles(start, end),
            run_game24,
            {"seed": seed, "max_new_tokens": max_new_tokens},
        )
    if name == "branch":
        task = task or "gsm8k"
        loaders: dict[str, Callable[[int, int], list[Any]]] = {
            "gsm8k": datasets.load_gsm8k,
            "arc_challenge": datasets.load_arc,
            "mmlu_stem": datasets.load_mmlu_stem,
        }
        if task not in loaders:
            raise UsageError(f"unknown task {task!r} for branch; choose from {', '.join(loaders)}")
        return Workload(
            "branch",
            task,
            loaders[task](start, end),
            run_branch,
            {
                "task": task,
                "branches": branches,
                "seed": seed,
                "max_new_tokens": max_new_tokens,
                "ignore_eos": ignore_eos,
            },
        )
    if name == "tree":
        if task not in (None, "gsm8k"):
            raise UsageError(f"the tree workload runs on gsm8k only, not {task!r}")
        return Workload(
            "tree",
            "gsm8k",
            datasets.load_gsm8k(start, end),
            run_tree,
            {"seed": seed, "max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos},
        )
    if name == "paraphrase":
        from treesearch.bench.paraphrase import load_items, run_paraphrase

        if task not in (None, "gsm8k"):
            raise UsageError(f"the paraphrase workload runs on gsm8k only, not {task!r}")
        if ignore_eos:
            raise UsageError(
                "paraphrase cannot run at fixed lengths (it compares answers); use branch or tree"
            )
        items, skipped = load_items(start, end, wordings)
        return Workload(
            "paraphrase",
            "gsm8k",
            items,
            run_paraphrase,
            {"seed": seed, "max_new_tokens": max_new_tokens, "skipped": skipped},
        )
    raise UsageError(f"unknown workload {name!r}; choose from game24, branch, tree, paraphrase")
