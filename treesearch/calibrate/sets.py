"""The data `treesearch calibrate` fits on: verification calls recorded with their label
distribution after every layer (a logit lens), and the search steps that used them.

Collectors (each a full-pass run of the real model over rows of a task):
- `collect_game24`: ToT BFS on Game of 24 rows through the `Searcher`, with the model's own
  proposals: each candidate keeps its own generation confidence (its move line's tokens), so
  Level 1 is calibrated on real generations.
- `collect_game24_oracle`: every legal move proposed, the model verifies (no generations).
- `collect_choice`: the answer letter of ARC / MMLU-STEM questions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np


# -- collected data ----------------------------------------------------------------------------------
@dataclass
class Dataset:
    """Verification calls and the search steps that used them.

    traj: [N, L, K] label probabilities of call i after layer l+1 (the last = the full pass).
    weights: [K] label weights (the value is weights . probs), or None for pure argmax tasks.
    steps: per search step, its candidates as dicts {node, parent, conf, call (index or None),
    value (programmatic value or None)}; empty for tasks without a search.
    """

    task: str
    model: str
    labels: list[str]
    weights: list[float] | None
    traj: np.ndarray
    steps: list[list[dict]] = field(default_factory=list)
    breadth: int = 5
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "task": self.task,
            "model": self.model,
            "labels": self.labels,
            "weights": self.weights,
            "traj": self.traj.round(6).tolist(),
            "steps": self.steps,
            "breadth": self.breadth,
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, d: dict) -> Dataset:
        return cls(
            task=d["task"],
            model=d["model"],
            labels=d["labels"],
            weights=d["weights"],
            traj=np.asarray(d["traj"], dtype=np.float64),
            steps=d["steps"],
            breadth=d["breadth"],
            meta=d.get("meta", {}),
        )


def collect_game24(
    lm, start: int, end: int, *, breadth: int = 5, seed: int = 0, log=print, checkpoint=None, problem=None
) -> Dataset:
    """ToT BFS (`Searcher` + `strategies.BFS`, greedy) on 24.csv rows [start, end) with full
    verification passes (`Searcher.verify_trace`), recording every call and, per depth, each
    candidate's own generation confidence (its move line's tokens: real model proposals, so
    Level 1 is calibrated on what a search will see). The searches stop below the problem's last
    depth: that step writes answers, valued by the checker only, so it holds no verification call
    and no decision CGEE could change. One Searcher serves all rows (each search starts with the
    last one's prompt K/V). `checkpoint(ds)` after each puzzle."""
    from strategies import BFS
    from treesearch.common.config import RKSCConfig
    from treesearch.search.searcher import Searcher
    from treesearch.tasks.game24 import Game24, load_puzzles

    problem = problem or Game24()
    labels = list(problem.labels)
    bfs = BFS(breadth=breadth, max_depth=problem.max_depth - 1)
    searcher = Searcher(lm, problem, bfs, RKSCConfig(kv_sharing="exact"), seed=seed, progress=False)
    trajs: list = []
    prompts: list[str] = []
    steps: list[list[dict]] = []
    t0 = time.perf_counter()
    ds = None
    for i, puzzle in enumerate(load_puzzles(start, end)):
        trace: dict[str, list] = {}
        searcher.verify_trace = trace
        result = searcher.solve(puzzle)
        index = {}
        for q, traj in trace.items():
            index[q] = len(trajs)
            trajs.append(traj)
            prompts.append(q)
        steps += _steps(result.tree, problem, index)
        log(f"  [{i + 1}/{end - start}] {puzzle}: {len(trace)} calls ({time.perf_counter() - t0:.0f}s)")
        ds = Dataset(
            task="game24",
            model=lm.name,
            labels=labels,
            weights=[problem.labels[k] for k in labels],
            traj=np.asarray(trajs, dtype=np.float64),
            steps=steps,
            breadth=breadth,
            meta={"range": f"{start}:{start + i + 1}", "proposer": "model", "prompts": list(prompts)},
        )
        if checkpoint is not None:
            checkpoint(ds)
    assert ds is not None, f"rows {start}:{end} hold no puzzle"  # the CLI checks START < END
    return ds


def _steps(tree, problem, index: dict[str, int]) -> list[list[dict]]:
    """One step per depth of a search tree: its candidates (all nodes at that depth, by id) with
    parent, confidence and either the programmatic value or the index of the recorded call."""
    steps = []
    for depth in range(1, problem.max_depth + 1):
        step = []
        for n in sorted(n for n in tree.graph.nodes if tree.node(n)["depth"] == depth):
            d = tree.node(n)
            value = problem.value(d["state"])
            call = None if value is not None else index[problem.value_prompt(d["state"])]
            step.append(
                {
                    "node": n,
                    "parent": tree.parent(n),
                    "conf": float(d.get("confidence", 0.0)),
                    "call": call,
                    "value": value,
                }
            )
        if not step:
            break
        steps.append(step)
    return steps


def legal_moves(numbers) -> list[tuple]:
    """Every state one exact move (+, -, *, / over two of the numbers) away, as `apply_move` parses it."""
    from treesearch.tasks.arith import fmt
    from treesearch.tasks.game24 import apply_move

    out, seen = [], set()
    for i in range(len(numbers)):
        for j in range(len(numbers)):
            if i == j:
                continue
            a, b = numbers[i], numbers[j]
            for op in "+-*/":
                if (op in "+*" and i > j) or (op == "/" and b == 0):
                    continue
                move = apply_move(numbers, f"{fmt(a)} {op} {fmt(b)} = ?")
                if move is not None and move[1] not in seen:
                    seen.add(move[1])
                    out.append(move)
    return out


def collect_game24_oracle(
    lm, start: int, end: int, *, breadth: int = 5, log=print, skip_prompts=(), checkpoint=None
) -> Dataset:
    """BFS on 24.csv rows [start, end) whose proposer is every legal move (no generation) and whose
    verifier is the model's real value prompt, scored with full passes: many real verification
    calls for little CPU. No generation means no confidences, so Level 1 never fires here."""
    from treesearch.common.config import RKSCConfig
    from treesearch.engine.local import Engine
    from treesearch.search.verifier import LayerRecorder
    from treesearch.tasks.game24 import Game24, load_puzzles

    problem = Game24()
    labels = list(problem.labels)
    w = np.asarray([problem.labels[k] for k in labels])
    engine = Engine(lm, RKSCConfig(kv_sharing="exact"))
    trajs: list = []
    index: dict[str, int] = {}
    skip = set(skip_prompts)
    steps: list[list[dict]] = []
    t0 = time.perf_counter()
    nid = 0
    for k, puzzle in enumerate(load_puzzles(start, end)):
        frontier = [(0, problem.initial_state(puzzle))]
        for _ in range(1, problem.max_depth):
            cands = []
            for parent, state in frontier:
                for thought, left in legal_moves(state.numbers):
                    nid += 1
                    child = type(state)(puzzle=state.puzzle, numbers=left, steps=state.steps + (thought,))
                    cands.append((nid, parent, child, problem.value_prompt(child)))
            new = sorted({q for *_, q in cands if q not in index and q not in skip})
            if new:
                rec = LayerRecorder()
                scores = engine.score(new, labels, exit_rule=rec)
                for q, traj, s in zip(new, rec.rows(), scores):
                    index[q] = len(trajs)
                    trajs.append(traj + [[s.probs[x] for x in labels]])
            step: list[dict[str, Any]] = [
                {"node": n, "parent": par, "conf": 0.0, "call": index[q], "value": None}
                for n, par, _, q in cands
                if q in index
            ]
            steps.append(step)
            full = {c["node"]: float(np.asarray(trajs[c["call"]][-1]) @ w) for c in step}
            keep = set(top_b(full, breadth))
            frontier = [(n, st) for n, _, st, _ in cands if n in keep]
        log(
            f"  [{k + 1}/{end - start}] {puzzle}: {len(trajs)} calls so far ({time.perf_counter() - t0:.0f}s)"
        )
        ds = Dataset(
            task="game24",
            model=lm.name,
            labels=labels,
            weights=w.tolist(),
            traj=np.asarray(trajs, dtype=np.float64),
            steps=steps,
            breadth=breadth,
            meta={"range": f"{start}:{start + k + 1}", "proposer": "legal", "prompts": list(index)},
        )
        if checkpoint is not None:
            checkpoint(ds)
    return ds


CHOICE_PROMPT = (
    "Answer the question with the letter of the correct choice.\nQuestion: {question}\n{choices}\nAnswer:"
)


def choice_prompt(question: str, choices: tuple[str, ...]) -> str:
    """The zero-shot multiple-choice prompt whose next token is scored over " A".." D"."""
    lines = "\n".join(f"{'ABCDE'[i]}. {c}" for i, c in enumerate(choices))
    return CHOICE_PROMPT.format(question=question, choices=lines)


def collect_choice(lm, task: str, start: int, end: int, *, log=print, batch: int = 8) -> Dataset:
    """Score the answer letter of ARC / MMLU-STEM rows [start, end) with full passes.

    Each row is scored over its own letters (" A".." C" for 3 choices, up to " E"); the recorded
    distributions are padded with zeros to the most letters in the range, which changes neither
    an entropy nor an argmax, so every row counts (ARC has rows with 3 and 5 choices)."""
    from treesearch.common.config import RKSCConfig
    from treesearch.engine.local import Engine
    from treesearch.search.verifier import LayerRecorder
    from treesearch.tasks import datasets

    loader = {"arc": datasets.load_arc, "mmlu": datasets.load_mmlu_stem}[task]
    items = loader(start, end)
    width = max(len(it.choices) for it in items)
    labels = [f" {x}" for x in "ABCDE"[:width]]
    engine = Engine(lm, RKSCConfig(kv_sharing="exact"))
    trajs: list = [None] * len(items)
    correct = 0
    done = 0
    t0 = time.perf_counter()
    for k in sorted({len(it.choices) for it in items}):
        rows = [i for i, it in enumerate(items) if len(it.choices) == k]
        mine = labels[:k]
        for lo in range(0, len(rows), batch):
            chunk = rows[lo : lo + batch]
            rec = LayerRecorder()
            prompts = [choice_prompt(items[i].question, items[i].choices) for i in chunk]
            scores = engine.score(prompts, mine, exit_rule=rec)
            pad = [0.0] * (width - k)
            for i, traj, sc in zip(chunk, rec.rows(), scores):
                trajs[i] = [p + pad for p in traj] + [[sc.probs[x] for x in mine] + pad]
                correct += max(mine, key=lambda x: sc.probs[x]).strip() == items[i].answer
            done += len(chunk)
            if (lo // batch) % 10 == 0:
                log(f"  [{done}/{len(items)}] ({time.perf_counter() - t0:.0f}s)")
    return Dataset(
        task=task,
        model=lm.name,
        labels=labels,
        weights=None,
        traj=np.asarray(trajs, dtype=np.float64),
        meta={
            "range": f"{start}:{end}",
            "accuracy": correct / max(1, len(items)),
            "choices": {
                str(k): sum(len(it.choices) == k for it in items)
                for k in sorted({len(it.choices) for it in items})
            },
        },
    )


def top_b(values: dict, b: int) -> set:
    """The b keys of highest value (ties: the smaller key), as BFS keeps them."""
    return set(sorted(values, key=lambda k: (-values[k], k))[:b])
