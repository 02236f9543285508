"""The `branch` workload (the paper's multi-branch protocol) and its verification step.

Per question: B branches of step-by-step reasoning sampled from one prompt (temperature 0.7,
top-p 0.95, seeds fixed per question and branch), each verified by one scoring pass over
" yes" / " no" after the branch's own context, then a score-weighted vote:
    answer = argmax_a sum_{i: a_i = a} P_i(yes)      (ties: the answer reached first).
Verification is the search's `Verifier`: with `cgee=True` the branches of a question are one
sibling set, so CGEE Level 1 may skip the whole verification (values from generation confidence)
and Level 2 may stop each scoring pass early; the Verifier counts and times it.
"""

from __future__ import annotations

import time

from treesearch.bench.engines import engine_for
from treesearch.bench.modes import cgee_thresholds_note
from treesearch.bench.prompts import BRANCH_STOP, VERIFY_LABELS, branch_prompt, verify_prompt
from treesearch.bench.results import FIXED_LENGTH_NOTE, RunResult, Tick
from treesearch.common.config import RKSCConfig, Sampling
from treesearch.common.seeds import stable_seed
from treesearch.engine.local import Engine
from treesearch.models.load import LanguageModel
from treesearch.policies.cgee import Branch, thresholds_for
from treesearch.search.verifier import Verifier
from treesearch.tasks.choice import extract_choice
from treesearch.tasks.gsm8k import extract_number
from treesearch.tasks.names import CALIBRATION_KEYS

TEMPERATURE = 0.7
TOP_P = 0.95
MAX_NEW_TOKENS = {"gsm8k": 160, "arc_challenge": 96, "mmlu_stem": 96}


def weighted_vote(answers: list[str | None], weights: list[float]) -> str | None:
    """The answer with the largest total weight (None answers ignored; ties: first reached)."""
    totals: dict[str, float] = {}
    for a, w in zip(answers, weights):
        if a is not None:
            totals[a] = totals.get(a, 0.0) + float(w)
    if not totals:
        return None
    best = max(totals.values())
    return next(a for a in totals if totals[a] == best)


def verifier(engine: Engine, config: RKSCConfig, model_name: str, task: str, out: RunResult) -> Verifier:
    """The search's Verifier over " yes" / " no", with the CGEE thresholds of the task (noted when CGEE is
    on)."""
    key = CALIBRATION_KEYS.get(task, task)
    if config.cgee:
        out.note(cgee_thresholds_note(config, model_name, key))
    return Verifier(engine, VERIFY_LABELS, config, thresholds_for(config, model_name, key))


def verify(v: Verifier, prompts: list[str], confidences: list[float]) -> list[float]:
    """P(yes) of each branch's verification prompt (one batched scoring pass); the branches of a
    question are one sibling set for CGEE Level 1 (a skipped branch takes its confidence value)."""
    found = v.verify(prompts, [[Branch(j, "question", c)] for j, c in enumerate(confidences)])
    return [found.values[j] for j in range(len(prompts))]


def run_branch(
    lm: LanguageModel,
    config: RKSCConfig,
    items: list,
    tick: Tick,
    *,
    task: str,
    branches: int = 8,
    seed: int = 0,
    max_new_tokens: int | None = None,
    ignore_eos: bool = False,
) -> RunResult:
    """ignore_eos: every branch generates exactly max_new_tokens (no EOS, no stop strings; for
    dummy weights, whose text is gibberish)."""
    max_new = max_new_tokens or MAX_NEW_TOKENS[task]
    out = RunResult(max_new_tokens=max_new)
    sampling = Sampling(
        max_new_tokens=max_new,
        temperature=TEMPERATURE,
        top_p=TOP_P,
        stop=() if ignore_eos else BRANCH_STOP,
        ignore_eos=ignore_eos,
    )
    if ignore_eos:
        out.note(FIXED_LENGTH_NOTE)
    engine = engine_for(lm, config)  # kept across items: each starts with the last one's prompt K/V
    v = verifier(engine, config, lm.name, task, out)
    for idx, item in enumerate(items):
        if idx:
            engine.new_search()
        prompt = branch_prompt(item)
        t0 = time.perf_counter()
        gens = engine.generate(
            [prompt] * branches, sampling, seeds=[stable_seed(seed, task, idx, j) for j in range(branches)]
        )
        if task == "gsm8k":
            answers = [extract_number(g.text) for g in gens]
        else:
            answers = [extract_choice(g.text, item.letters) for g in gens]
        values = verify(v, [verify_prompt(prompt, g.text) for g in gens], [g.confidence for g in gens])
        final = weighted_vote(answers, values)
        out.wall_s += time.perf_counter() - t0
        out.add_stats(engine.stats.as_dict())
        out.decisions += [
            f"{idx}|branch {j}|{a}|verified {'yes' if v > 0.5 else 'no'}"
            for j, (a, v) in enumerate(zip(answers, values))
        ] + [f"{idx}|vote|{final}"]
        out.correct.append(final == item.answer)
        out.requests.append([[prompt] * branches])
        tick(1)
    return out
