"""The `paraphrase` workload: one question asked in k wordings, where ASKS can share after the differing span.

Each GSM8K question (the shipped test split) is split into its fact sentences and its final
question sentence. Its k wordings list the same facts in k different orders (fixed templates:
as given, reversed, rotated left, rotated right; the first k distinct ones), one fact per line, so
every wording has the same tokens in another order and the same length. Each wording is followed
by the same long shared part (the instructions, placed AFTER the question; worked examples there
made this 135M model copy their answers whatever the facts, so there are none):

    Facts:\\n- f1\\n- f2\\nQuestion: q\\n + SHARED_PART (ending "Reasoning: Step 1:")

The k prompts of a question then differ only in the facts' span and share everything after it,
the case ASKS was made for (exact prefix sharing stops at the first differing fact). Per question:
one greedy generate call over the k prompts (reasoning ending "The answer is N."), one scoring call
verifying each wording's reasoning (" yes" / " no" after its own context), a score-weighted vote.
Questions with fewer than two fact sentences have one wording only and are left out (counted).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from treesearch.bench.branch import verifier, verify, weighted_vote
from treesearch.bench.engines import engine_for
from treesearch.bench.prompts import VERIFY_SUFFIX
from treesearch.bench.results import RunResult, Tick
from treesearch.common.config import RKSCConfig, Sampling
from treesearch.common.errors import UsageError
from treesearch.models.load import LanguageModel
from treesearch.tasks.datasets import load_gsm8k
from treesearch.tasks.gsm8k import extract_number

WORDINGS = 4  # wordings per question (at most 4 orders; 2 when a question has 2 facts)
MAX_NEW_TOKENS = 32
STOP = ("\n\n", "\nFacts:", "\nQuestion:")
SHARED_PART = """
Instructions: read the facts and the question above carefully. The facts may be listed in any order, and every one of them matters. Solve the problem step by step. In each step, name the quantity you compute, write the calculation with the numbers from the facts, and give its result. Keep every step short. Do not repeat the question and do not add new facts. When the last step gives the quantity the question asks for, finish with the sentence "The answer is N." where N is that number, written without units.
Reasoning: Step 1:"""  # noqa: E501  (prompt text: the model sees these lines as they are)


@dataclass(frozen=True)
class ParaphraseItem:
    """One GSM8K question: its row, its k wordings (same facts, other orders) and the answer."""

    row: int
    wordings: tuple[str, ...]
    answer: str


def split_facts(question: str) -> tuple[list[str], str]:
    """("Janet has 3 ducks. Each lays 2 eggs. How many eggs?") -> (["Janet has 3 ducks.", "Each lays 2
    eggs."], "How many eggs?")."""
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", question.strip()) if s.strip()]
    return sentences[:-1], sentences[-1] if sentences else ""


def orders(n: int, k: int) -> list[tuple[int, ...]]:
    """The first k distinct fact orders among: as given, reversed, rotated left, rotated right."""
    ids = list(range(n))
    out: list[tuple[int, ...]] = []
    for order in (ids, ids[::-1], ids[1:] + ids[:1], ids[-1:] + ids[:-1]):
        if tuple(order) not in out:
            out.append(tuple(order))
    return out[:k]


def wording(facts: list[str], question: str, order: tuple[int, ...]) -> str:
    """One wording's prompt: the facts in `order`, the question, then the shared part."""
    lines = "".join(f"- {facts[i]}\n" for i in order)
    return f"Facts:\n{lines}Question: {question}\n{SHARED_PART}"


def load_items(start: int, end: int, k: int = WORDINGS) -> tuple[list[ParaphraseItem], int]:
    """GSM8K test rows [start, end) with at least two facts, as k wordings each; and how many rows were
    left out."""
    if k < 2:
        raise UsageError(f"--wordings {k}: ASKS needs at least 2 wordings per question")
    items, skipped = [], 0
    for row, item in enumerate(load_gsm8k(start, end), start):
        facts, question = split_facts(item.question)
        if len(facts) < 2:
            skipped += 1
            continue
        items.append(
            ParaphraseItem(
                row, tuple(wording(facts, question, o) for o in orders(len(facts), k)), item.answer
            )
        )
    return items, skipped


def answer(
    engine, v, item: ParaphraseItem, sampling: Sampling
) -> tuple[list[str | None], list[float], list[dict]]:
    """One question: each wording's answer (one generate call), its P(yes) (one verification call),
    and the ASKS gate records of the generate call (row = wording)."""
    before = len(engine.asks_log) if hasattr(engine, "asks_log") else 0
    gens = engine.generate(list(item.wordings), sampling)
    gate = list(engine.asks_log[before:]) if hasattr(engine, "asks_log") else []
    answers = [extract_number(g.text) for g in gens]
    values = verify(
        v, [w + g.text + VERIFY_SUFFIX for w, g in zip(item.wordings, gens)], [g.confidence for g in gens]
    )
    return answers, values, gate


def decisions(item: ParaphraseItem, answers: list[str | None], values: list[float]) -> list[str]:
    """The decisions compared across modes: per wording its answer and verdict, then the vote."""
    final = weighted_vote(answers, values)
    return [
        f"{item.row}|wording {j}|{a}|verified {'yes' if p > 0.5 else 'no'}"
        for j, (a, p) in enumerate(zip(answers, values))
    ] + [f"{item.row}|vote|{final}"]


def run_paraphrase(
    lm: LanguageModel,
    config: RKSCConfig,
    items: list[ParaphraseItem],
    tick: Tick,
    *,
    seed: int = 0,
    max_new_tokens: int | None = None,
    skipped: int = 0,
) -> RunResult:
    """Per question: greedy reasoning for each wording (one call), verification (one call), a weighted
    vote."""
    del seed  # greedy: nothing is sampled
    max_new = max_new_tokens or MAX_NEW_TOKENS
    out = RunResult(max_new_tokens=max_new)
    if skipped:
        out.note(f"{skipped} rows with fewer than two fact sentences left out (one wording only)")
    out.note(
        f"{sum(len(it.wordings) for it in items)} wordings of {len(items)} questions, "
        f"facts reordered before one shared part of instructions and examples"
    )
    sampling = Sampling(max_new_tokens=max_new, stop=STOP)
    engine = engine_for(lm, config)  # kept across items: each starts with the last one's prompt K/V
    v = verifier(engine, config, lm.name, "gsm8k", out)
    for idx, item in enumerate(items):
        if idx:
            engine.new_search()
        t0 = time.perf_counter()
        answers, values, _ = answer(engine, v, item, sampling)
        out.wall_s += time.perf_counter() - t0
        out.add_stats(engine.stats.as_dict())
        out.decisions += decisions(item, answers, values)
        out.correct.append(weighted_vote(answers, values) == item.answer)
        out.requests.append([list(item.wordings)])
        tick(1)
    return out
