"""The data `treesearch calibrate` fits on: verification calls recorded with their label
distribution after every layer (a logit lens), and the search steps that used them.

Collectors (each a full-pass run of the real model over rows of a task):
- `collect_game24_batched`: ToT BFS on Game of 24 rows, many puzzles at a time (one engine call
  per depth for a whole group), with the model's own proposals: each candidate keeps its own
  generation confidence (its move line's tokens), so Level 1 is calibrated on real generations.
- `collect_game24`: the same through one `Searcher` per puzzle (slower; the reference).
- `collect_game24_oracle`: every legal move proposed, the model verifies (no generations).
- `collect_choice`: the answer letter of ARC / MMLU-STEM questions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

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
        return {"task": self.task, "model": self.model, "labels": self.labels, "weights": self.weights,
                "traj": self.traj.round(6).tolist(), "steps": self.steps, "breadth": self.breadth, "meta": self.meta}

    @classmethod
    def from_json(cls, d: dict) -> Dataset:
        return cls(task=d["task"], model=d["model"], labels=d["labels"], weights=d["weights"],
                   traj=np.asarray(d["traj"], dtype=np.float64), steps=d["steps"], breadth=d["breadth"],
                   meta=d.get("meta", {}))


def collect_game24(lm, start: int, end: int, *, breadth: int = 5, log=print, checkpoint=None,
                   problem=None) -> Dataset:
    """Run ToT BFS on 24.csv rows [start, end) with full verification passes, recording every call
    and, per step, each candidate's own generation confidence (its move line's tokens: real model
    proposals, so Level 1 is calibrated on what a search will see). `checkpoint(ds)` after each puzzle."""
    from strategies import BFS

    from .config import RKSCConfig
    from .searcher import Searcher
    from .tasks.game24 import Game24, load_puzzles

    problem = problem or Game24()
    labels = list(problem.labels)
    trajs: list = []
    prompts: list[str] = []
    steps: list[list[dict]] = []
    solved = 0
    t0 = time.perf_counter()
    ds = None
    for i, puzzle in enumerate(load_puzzles(start, end)):
        searcher = Searcher(lm, problem, BFS(breadth=breadth), RKSCConfig(kv_sharing="exact"), progress=False)
        searcher.cgee_trace = trace = {}
        result = searcher.solve(puzzle)
        index = {}
        for q, traj in trace.items():
            index[q] = len(trajs)
            trajs.append(traj)
            prompts.append(q)
        solved += bool(result.solved)
        tree = result.tree
        for depth in range(1, problem.max_depth + 1):
            nodes = [n for n in tree.graph.nodes if tree.node(n)["depth"] == depth]
            if not nodes:
                break
            step = []
            for n in sorted(nodes):
                d = tree.node(n)
                state = d["state"]
                value = problem.value(state)
                call = None if value is not None else index.get(problem.value_prompt(state))
                if value is None and call is None:
                    continue  # valued in an earlier search of the same prompt: not in this trace
                step.append({"node": n, "parent": tree.parent(n), "conf": float(d.get("confidence", 0.0)),
                             "call": call, "value": value})
            steps.append(step)
        log(f"  [{i + 1}/{end - start}] {puzzle}: {len(trace)} calls, solved={result.solved} "
            f"({time.perf_counter() - t0:.0f}s)")
        ds = Dataset(task="game24", model=lm.name, labels=labels, weights=[problem.labels[k] for k in labels],
                     traj=np.asarray(trajs, dtype=np.float64), steps=steps, breadth=breadth,
                     meta={"range": f"{start}:{start + i + 1}", "proposer": "model", "solved": solved,
                           "prompts": list(prompts)})
        if checkpoint is not None:
            checkpoint(ds)
    return ds


def collect_game24_batched(lm, start: int, end: int, *, breadth: int = 5, group: int = 8, seed: int = 0,
                           log=print, checkpoint=None, problem=None) -> Dataset:
    """ToT BFS (as `strategies.BFS` with `Searcher`, greedy) on 24.csv rows [start, end), `group`
    puzzles at a time so that each depth is one batched generate and one batched scoring call.

    Per puzzle and depth: expand every kept state (the model's proposals), parse the children with
    their line spans (`Game24.parse_children`), dropping repeats of a sibling's state as the Searcher
    does; give each child its span's confidence; value it (the exact checker for answers, else the
    value prompt, scored once per puzzle with a full pass recording every layer); keep the top
    `breadth` by value (ties: earlier node). Steps 1-3 are recorded: step 4 writes answers, valued
    by the checker only, so it holds no verification call and no decision CGEE could change.
    `checkpoint(ds)` after each group."""
    from .cgee import span_confidence, token_offsets
    from .config import RKSCConfig
    from .engine import Engine
    from .seeds import stable_seed
    from .tasks.game24 import Game24, load_puzzles
    from .verify import LayerRecorder

    problem = problem or Game24()
    labels = list(problem.labels)
    weights = [problem.labels[k] for k in labels]
    puzzles = load_puzzles(start, end)
    trajs: list = []
    prompts: list[str] = []
    steps: list[list[dict]] = []
    t0 = time.perf_counter()
    ds = None
    for g0 in range(0, len(puzzles), group):
        engine = Engine(lm, RKSCConfig(kv_sharing="exact"))  # one per group: its cache holds only this group
        names = puzzles[g0:g0 + group]
        kept = {p: [(0, problem.initial_state(x))] for p, x in enumerate(names)}
        count = {p: 1 for p in kept}  # next node id per puzzle (the root is 0)
        calls: dict[tuple[int, str], int] = {}  # (puzzle, value prompt) -> call index
        mine: dict[int, list[list[dict]]] = {p: [] for p in kept}  # puzzle -> its steps
        for _ in range(1, problem.max_depth):
            live = [(p, n, st) for p in kept for n, st in kept[p] if not problem.is_terminal(st)]
            if not live:
                break
            gens = engine.generate([problem.expand_prompt(st) for _, _, st in live], problem.sampling,
                                   seeds=[stable_seed(seed, n, 0) for _, n, _ in live])
            cands: dict[int, list[tuple[int, int, object, float]]] = {p: [] for p in kept}
            for (p, n, st), gen in zip(live, gens):
                seen, offsets = set(), None
                for c in problem.parse_children(st, gen.text):
                    key = problem.state_key(c.state)
                    if key in seen:
                        continue
                    seen.add(key)
                    if c.span is not None and offsets is None:
                        offsets = token_offsets(lm.tokenizer, gen.token_ids)
                    conf = span_confidence(offsets or [], gen.logprobs, c.span, len(gen.text))
                    cands[p].append((count[p], n, c.state, conf))
                    count[p] += 1
            new = sorted({(p, problem.value_prompt(c[2])) for p in cands for c in cands[p]
                          if problem.value(c[2]) is None} - set(calls))
            unique = sorted({q for _, q in new})
            if unique:
                rec = LayerRecorder()
                scores = engine.score(unique, labels, exit_rule=rec)
                row = {q: traj + [[s.probs[k] for k in labels]] for q, traj, s in zip(unique, rec.rows(), scores)}
                for p, q in new:
                    calls[p, q] = len(trajs)
                    trajs.append(row[q])
                    prompts.append(q)
            for p in sorted(cands):
                step, values = [], {}
                for nid, parent, st, conf in cands[p]:
                    v = problem.value(st)
                    call = None if v is not None else calls[p, problem.value_prompt(st)]
                    values[nid] = v if v is not None else float(np.asarray(trajs[call][-1]) @ np.asarray(weights))
                    step.append({"node": nid, "parent": parent, "conf": conf, "call": call, "value": v})
                if step:
                    mine[p].append(step)
                keep = top_b(values, breadth)  # in BFS's order (value, then id): the next ids follow it
                kept[p] = sorted([(nid, st) for nid, _, st, _ in cands[p] if nid in keep],
                                 key=lambda x: (-values[x[0]], x[0]))
        steps += [st for p in sorted(mine) for st in mine[p]]  # puzzle by puzzle, as one search each
        log(f"  [{g0 + len(names)}/{len(puzzles)}] {len(trajs)} calls, {len(steps)} steps "
            f"({time.perf_counter() - t0:.0f}s)")
        ds = Dataset(task="game24", model=lm.name, labels=labels, weights=weights,
                     traj=np.asarray(trajs, dtype=np.float64), steps=steps, breadth=breadth,
                     meta={"range": f"{start}:{start + g0 + len(names)}", "proposer": "model",
                           "collector": "batched", "prompts": list(prompts)})
        if checkpoint is not None:
            checkpoint(ds)
    return ds


def legal_moves(numbers) -> list[tuple]:
    """Every state one exact move (+, -, *, / over two of the numbers) away, as `apply_move` parses it."""
    from .tasks.arith import fmt
    from .tasks.game24 import apply_move

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


def collect_game24_oracle(lm, start: int, end: int, *, breadth: int = 5, log=print, skip_prompts=(),
                          checkpoint=None) -> Dataset:
    """BFS on 24.csv rows [start, end) whose proposer is every legal move (no generation) and whose
    verifier is the model's real value prompt, scored with full passes: many real verification
    calls for little CPU. No generation means no confidences, so Level 1 never fires here."""
    from .config import RKSCConfig
    from .engine import Engine
    from .tasks.game24 import Game24, load_puzzles
    from .verify import LayerRecorder

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
        values: dict[str, float] = {}
        for depth in range(1, problem.max_depth):
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
            step = [{"node": n, "parent": par, "conf": 0.0, "call": index[q], "value": None}
                    for n, par, _, q in cands if q in index]
            steps.append(step)
            full = {c["node"]: float(np.asarray(trajs[c["call"]][-1]) @ w) for c in step}
            keep = set(top_b(full, breadth))
            frontier = [(n, st) for n, _, st, _ in cands if n in keep]
        log(f"  [{k + 1}/{end - start}] {puzzle}: {len(trajs)} calls so far ({time.perf_counter() - t0:.0f}s)")
        ds = Dataset(task="game24", model=lm.name, labels=labels, weights=w.tolist(),
                     traj=np.asarray(trajs, dtype=np.float64), steps=steps, breadth=breadth,
                     meta={"range": f"{start}:{start + k + 1}", "proposer": "legal", "prompts": list(index)})
        if checkpoint is not None:
            checkpoint(ds)
    return ds


CHOICE_PROMPT = "Answer the question with the letter of the correct choice.\nQuestion: {question}\n{choices}\nAnswer:"


def choice_prompt(question: str, choices: tuple[str, ...]) -> str:
    """The zero-shot multiple-choice prompt whose next token is scored over " A".." D"."""
    lines = "\n".join(f"{'ABCDE'[i]}. {c}" for i, c in enumerate(choices))
    return CHOICE_PROMPT.format(question=question, choices=lines)


def collect_choice(lm, task: str, start: int, end: int, *, log=print, batch: int = 8) -> Dataset:
    """Score the answer letter of ARC / MMLU-STEM rows [start, end) with full passes.

    Each row is scored over its own letters (" A".." C" for 3 choices, up to " E"); the recorded
    distributions are padded with zeros to the most letters in the range, which changes neither
    an entropy nor an argmax, so every row counts (ARC has rows with 3 and 5 choices)."""
    from .config import RKSCConfig
    from .engine import Engine
    from .tasks import datasets
    from .verify import LayerRecorder

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
            chunk = rows[lo:lo + batch]
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
    return Dataset(task=task, model=lm.name, labels=labels, weights=None, traj=np.asarray(trajs, dtype=np.float64),
                   meta={"range": f"{start}:{end}", "accuracy": correct / max(1, len(items)),
                         "choices": {str(k): sum(len(it.choices) == k for it in items)
                                     for k in sorted({len(it.choices) for it in items})}})


def top_b(values: dict, b: int) -> set:
    """The b keys of highest value (ties: the smaller key), as BFS keeps them."""
    return set(sorted(values, key=lambda k: (-values[k], k))[:b])
