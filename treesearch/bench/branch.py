"""The `branch` workload (the paper's multi-branch protocol) and its verification step.

Per question: B branches of step-by-step reasoning sampled from one prompt (temperature 0.7,
top-p 0.95, seeds fixed per question and branch), each verified by one scoring pass over
" yes" / " no" after the branch's own context, then a score-weighted vote:
    answer = argmax_a sum_{i: a_i = a} P_i(yes)      (ties: the answer reached first).
With `cgee=True` the branches of a question are one sibling set: CGEE Level 1 may skip the whole
verification (values from generation confidence), Level 2 may stop each scoring pass early.
"""

from __future__ import annotations

import time

from ..config import RKSCConfig, Sampling
from ..engine import Engine
from ..runtime import LanguageModel
from .backends import engine_for
from ..seeds import stable_seed
from ..tasks.choice import extract_choice
from ..tasks.gsm8k import extract_number
from .prompts import BRANCH_STOP, VERIFY_LABELS, branch_prompt, verify_prompt
from .workloads import RunResult, Tick, cgee_thresholds_note

TEMPERATURE = 0.7
TOP_P = 0.95
MAX_NEW_TOKENS = {"gsm8k": 160, "arc_challenge": 96, "mmlu_stem": 96}
CALIBRATION_TASK = {"gsm8k": "gsm8k", "arc_challenge": "arc", "mmlu_stem": "mmlu"}  # keys of calibration/*.json


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


def verify(engine: Engine, config: RKSCConfig, prompts: list[str], confidences: list[float],
           model_name: str, task: str, out: RunResult) -> list[float]:
    """P(yes) of each branch's verification prompt (one batched scoring pass), CGEE when on."""
    stats = engine.stats
    labels = list(VERIFY_LABELS)
    exit_rule = None
    if config.cgee:
        try:
            from .. import cgee
        except ImportError:
            out.note("CGEE missing: treesearch.cgee cannot be imported; verification runs in full")
            cgee = None
        if cgee is not None:
            key = CALIBRATION_TASK.get(task, task)
            th = cgee.thresholds_for(config, model_name, key)
            out.note(cgee_thresholds_note(config, model_name, key))
            if cgee.decisive_branch(confidences, th.tau_conf, th.margin) is not None:
                stats.verify_calls += len(prompts)
                stats.verify_skipped += len(prompts)
                return [cgee.confidence_value(c, VERIFY_LABELS) for c in confidences]
            exit_rule = cgee.LayerExit(th)
    before = (stats.verify_calls, stats.verify_layers_run, stats.verify_layers_full)
    try:
        scores = engine.score(prompts, labels, exit_rule=exit_rule)
    except RuntimeError as err:  # an engine whose exit rule is one bool for the whole batch
        if exit_rule is None or "ambiguous" not in str(err):
            raise
        out.note("CGEE layer exit not supported by this engine (it expects one bool per batch); full passes")
        scores = engine.score(prompts, labels)
    # count what the engine did not count itself (the Searcher counts verify_calls today)
    if stats.verify_calls == before[0]:
        stats.verify_calls += len(prompts)
    if stats.verify_layers_run == before[1]:
        stats.verify_layers_run += sum(s.layers_run for s in scores)
    if stats.verify_layers_full == before[2]:
        stats.verify_layers_full += engine.num_layers * len(scores)
    return [s.probs[" yes"] for s in scores]


def run_branch(lm: LanguageModel, config: RKSCConfig, items: list, tick: Tick, *, task: str,
               branches: int = 8, seed: int = 0, max_new_tokens: int | None = None) -> RunResult:
    max_new = max_new_tokens or MAX_NEW_TOKENS[task]
    out = RunResult(max_new_tokens=max_new)
    sampling = Sampling(max_new_tokens=max_new, temperature=TEMPERATURE, top_p=TOP_P,
                        stop=BRANCH_STOP)
    engine = engine_for(lm, config)  # kept across items: each starts with the last one's prompt K/V
    for idx, item in enumerate(items):
        if idx:
            engine.new_search()
        prompt = branch_prompt(item)
        t0 = time.perf_counter()
        gens = engine.generate([prompt] * branches, sampling,
                               seeds=[stable_seed(seed, task, idx, j) for j in range(branches)])
        if task == "gsm8k":
            answers = [extract_number(g.text) for g in gens]
        else:
            answers = [extract_choice(g.text, item.letters) for g in gens]
        t1 = time.perf_counter()
        values = verify(engine, config, [verify_prompt(prompt, g.text) for g in gens],
                        [g.confidence for g in gens], lm.name, task, out)
        engine.stats.verify_s += time.perf_counter() - t1
        final = weighted_vote(answers, values)
        out.wall_s += time.perf_counter() - t0
        out.add_stats(engine.stats.as_dict())
        out.decisions += [f"{idx}|branch {j}|{a}|verified {'yes' if v > 0.5 else 'no'}"
                          for j, (a, v) in enumerate(zip(answers, values))] + [f"{idx}|vote|{final}"]
        out.correct.append(final == item.answer)
        out.requests.append([[prompt] * branches])
        tick(1)
    return out
