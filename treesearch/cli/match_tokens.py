"""`treesearch run --strategy sc --match-tokens OTHER.jsonl`: self-consistency at another run's cost.

The samples k are chosen so that a problem's tokens (prefill + decode) match OTHER's mean. The k
chains of a problem share one prompt (its K/V computed once), so a problem costs about P + k * D:
P the prompt's prefill, D one chain's decode. A pilot measures both: self-consistency with one
sample on the run's first rows (P: the median prefill per row, which leaves out the few-shot
template the first row computes for all; D: the mean decode per row), then

    k = max(1, round((T - P) / D)),  T = OTHER's mean tokens per searched problem.

A resumed run takes k from the rows already in its file, so it goes on with the k it began with.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, replace
from typing import Any

from treesearch.common.errors import SaveFileError, UsageError


@dataclass(frozen=True)
class Pilot:
    """What one chain costs: the prompt's prefill (median over rows) and one chain's decode (mean)."""

    prompt: float
    chain: float
    rows: int


def samples_for_tokens(target: float, pilot: Pilot) -> int:
    """k = max(1, round((target - prompt) / chain)) (Python's round: halves to even)."""
    if pilot.chain <= 0:
        raise UsageError("--match-tokens: the pilot chains generated no tokens; give --samples K instead")
    return max(1, round((target - pilot.prompt) / pilot.chain))


def target_tokens(path: str) -> float:
    """OTHER's mean tokens (prefill + decode) per searched problem; UsageError when it has none."""
    from treesearch.runs.compare import read_rows
    from treesearch.runs.results_file import row_tokens

    try:
        rows = [r for r in read_rows(path) if r.get("status") != "invalid"]
    except SaveFileError as exc:
        raise UsageError(f"--match-tokens {exc}") from None
    costs = [row_tokens(r) for r in rows]
    if not costs or not any(costs):
        raise UsageError(
            f"--match-tokens {path}: no searched row with a token count; give another run's file"
        )
    return sum(costs) / len(costs)


def check_match_tokens(args: argparse.Namespace) -> float | None:
    """The target of --match-tokens (None without it), checked before the model loads."""
    if args.match_tokens is None:
        return None
    if args.strategy.lower() != "sc":
        raise UsageError("--match-tokens chooses self-consistency's samples; use it with --strategy sc")
    if args.samples is not None:
        raise UsageError("--match-tokens chooses --samples itself; give one of them, not both")
    if args.workers is not None:
        raise UsageError(
            "--match-tokens runs its pilot in this process; leave out --workers or give --samples K"
        )
    return target_tokens(args.match_tokens)


def measure(model: Any, plan: Any, args: argparse.Namespace, inputs: list[Any]) -> Pilot:
    """Self-consistency with one sample on `inputs` (same model, settings and seed as the run)."""
    from strategies import SelfConsistency
    from treesearch.search.searcher import Searcher

    one = SelfConsistency(samples=1)
    searcher = Searcher(
        model,
        one.problem_for(plan.problem),
        one,
        plan.config,
        sampling=plan.sampling,
        seed=args.seed,
        progress=False,
    )
    results = list(searcher.solve_many(inputs, concurrency=args.concurrency))
    prefill = [r.stats.get("prefill_tokens", 0) for r in results]
    decode = [r.stats.get("decode_tokens", 0) for r in results]
    return Pilot(prompt=float(statistics.median(prefill)), chain=sum(decode) / len(decode), rows=len(results))


def choose(model: Any, plan: Any, args: argparse.Namespace, items: list, done: dict, target: float) -> Any:
    """The plan with self-consistency at k samples chosen for `target` tokens per problem (from the
    rows already done when resuming, else from a pilot on the first rows); prints the choice."""
    from strategies import SelfConsistency
    from treesearch.cli.checks import search_sampling

    before = {
        r.get("strategy", {}).get("samples") for r in done.values() if isinstance(r.get("strategy"), dict)
    }
    before.discard(None)
    if len(before) == 1:
        k = int(before.pop())
        print(f"match-tokens: k = {k}, the samples of the rows already in the file", file=sys.stderr)
    else:
        valid = []
        for _, x in items:
            try:
                plan.problem.check_input(x)
            except Exception:  # an invalid row is recorded by the run itself
                continue
            valid.append(x)
            if len(valid) == PILOT_ROWS:
                break
        if not valid:
            raise UsageError("--match-tokens: no valid input to measure a chain on; give --samples K")
        pilot = measure(model, plan, args, valid)
        k = samples_for_tokens(target, pilot)
        print(
            f"match-tokens: {args.match_tokens} costs T = {target:.1f} tokens per problem; a chain costs "
            f"D = {pilot.chain:.1f} decode tokens after a prompt of P = {pilot.prompt:.1f} prefill tokens "
            f"(pilot: self-consistency with 1 sample on {pilot.rows} rows); k = max(1, round((T - P) / D)) "
            f"= {k}",
            file=sys.stderr,
        )
    strategy = SelfConsistency(samples=k)
    problem = strategy.problem_for(plan.problem)
    return replace(plan, strategy=strategy, problem=problem, sampling=search_sampling(args, problem))


PILOT_ROWS = 4  # rows of the pilot that measures one chain's cost
