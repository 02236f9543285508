"""The `tree` workload: an SGLang-style fixed tree on GSM8K, generation heavy, no verification.

Level 1 samples 3 plans from the question, level 2 samples 3 executions of each plan (9), level
3 samples 3 reflections of each execution (27 leaves). Each level's prompt is its parent's prompt
+ the parent's text + the next level's cue (chain style), so exact sharing reuses every ancestor.
The answer is the majority over the leaves' final numbers (a leaf without one in its reflection
falls back to its execution's); ties go to the answer reached first.
"""

from __future__ import annotations

import time
from collections import Counter

from treesearch.bench.branch import TEMPERATURE, TOP_P
from treesearch.bench.engines import engine_for
from treesearch.bench.prompts import TREE_LEVELS, TREE_STOP, tree_prompt
from treesearch.bench.results import FIXED_LENGTH_NOTE, RunResult, Tick
from treesearch.common.config import RKSCConfig, Sampling
from treesearch.common.seeds import stable_seed
from treesearch.models.load import LanguageModel
from treesearch.tasks.gsm8k import extract_number

WIDTH = 3
MAX_NEW_TOKENS = (48, 96, 64)  # plan, execute, reflect


def majority(answers: list[str | None]) -> str | None:
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)


def run_tree(
    lm: LanguageModel,
    config: RKSCConfig,
    items: list,
    tick: Tick,
    *,
    seed: int = 0,
    max_new_tokens: int | None = None,
    ignore_eos: bool = False,
) -> RunResult:
    """ignore_eos: every generation runs exactly its level's length (no EOS, no stop strings; for
    dummy weights, whose text is gibberish)."""
    lengths = MAX_NEW_TOKENS if max_new_tokens is None else (max_new_tokens,) * len(MAX_NEW_TOKENS)
    out = RunResult(max_new_tokens=max(lengths))
    if ignore_eos:
        out.note(FIXED_LENGTH_NOTE)
    if config.cgee:
        out.note("tree has no verification step: CGEE has nothing to skip here")
    engine = engine_for(lm, config)  # kept across items: each starts with the last one's prompt K/V
    for idx, item in enumerate(items):
        if idx:
            engine.new_search()
        contexts = [tree_prompt(item)]
        parents_text = [""]
        batches = []
        t0 = time.perf_counter()
        for level, max_new in enumerate(lengths):
            prompts = [c for c in contexts for _ in range(WIDTH)]
            carried = [t for t in parents_text for _ in range(WIDTH)]
            sampling = Sampling(
                max_new_tokens=max_new,
                temperature=TEMPERATURE,
                top_p=TOP_P,
                stop=() if ignore_eos else TREE_STOP,
                ignore_eos=ignore_eos,
            )
            gens = engine.generate(
                prompts,
                sampling,
                seeds=[stable_seed(seed, "tree", idx, level, k) for k in range(len(prompts))],
            )
            batches.append(prompts)
            if level < len(TREE_LEVELS):
                contexts = [p + g.text + TREE_LEVELS[level] for p, g in zip(prompts, gens)]
                parents_text = [g.text for g in gens]
        answers = [extract_number(g.text) or extract_number(prev) for g, prev in zip(gens, carried)]
        final = majority(answers)
        out.wall_s += time.perf_counter() - t0
        out.add_stats(engine.stats.as_dict())
        out.decisions += [f"{idx}|leaf {k}|{a}" for k, a in enumerate(answers)] + [f"{idx}|majority|{final}"]
        out.correct.append(final == item.answer)
        out.requests.append(batches)
        tick(1)
    return out
