"""Two runs of one test set compared row by row (`treesearch compare A.jsonl B.jsonl`): on the rows
both searched, how many both solved, only A, only B, neither; the accuracy difference A - B with
Newcombe's paired 95% interval; McNemar's exact p-value; and each run's cost per problem there.

Rows pair by their index; a pair whose inputs differ is refused (the files are runs over different
inputs). A row either run did not search (status "invalid") is left out; a failed search counts as
not solved, as in the run's own summary.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from treesearch.common.errors import SaveFileError
from treesearch.common.intervals import mcnemar_exact, paired_difference, wilson
from treesearch.runs.results_file import row_seconds, row_tokens


@dataclass
class Comparison:
    """The paired table of two runs on their common rows, and what follows from it."""

    rows: int
    both: int
    only_a: int
    only_b: int
    neither: int
    accuracy_a: float
    accuracy_b: float
    difference: float  # accuracy_a - accuracy_b
    difference_low: float  # Newcombe's paired 95% interval (method 10)
    difference_high: float
    p_value: float  # McNemar's exact test, two-sided
    tokens_a: float  # mean tokens per problem (prefill + decode) on the common rows
    tokens_b: float
    seconds_a: float  # mean wall seconds per problem on the common rows
    seconds_b: float

    def to_dict(self) -> dict:
        return asdict(self)


def compare_rows(a: list[dict], b: list[dict]) -> Comparison:
    """The comparison of two runs' lines (see the module docstring for the pairing)."""
    by_index = {int(r["index"]): r for r in b}
    pairs = []
    for ra in a:
        rb = by_index.get(int(ra["index"]))
        if rb is None or "invalid" in (ra.get("status"), rb.get("status")):
            continue
        if ra.get("input") != rb.get("input"):
            raise SaveFileError(
                f"row {ra['index']} has different inputs in the two files ({ra.get('input')!r:.40} and "
                f"{rb.get('input')!r:.40}); compare runs over the same inputs"
            )
        pairs.append((ra, rb))
    sa = [bool(x.get("solved")) for x, _ in pairs]
    sb = [bool(y.get("solved")) for _, y in pairs]
    both = sum(x and y for x, y in zip(sa, sb))
    only_a = sum(x and not y for x, y in zip(sa, sb))
    only_b = sum(y and not x for x, y in zip(sa, sb))
    n = len(pairs)
    neither = n - both - only_a - only_b
    low, high = paired_difference(both, only_a, only_b, neither)
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    return Comparison(
        rows=n,
        both=both,
        only_a=only_a,
        only_b=only_b,
        neither=neither,
        accuracy_a=(both + only_a) / n if n else 0.0,
        accuracy_b=(both + only_b) / n if n else 0.0,
        difference=(only_a - only_b) / n if n else 0.0,
        difference_low=low,
        difference_high=high,
        p_value=mcnemar_exact(only_a, only_b),
        tokens_a=mean([row_tokens(x) for x, _ in pairs]),
        tokens_b=mean([row_tokens(y) for _, y in pairs]),
        seconds_a=mean([row_seconds(x) for x, _ in pairs]),
        seconds_b=mean([row_seconds(y) for _, y in pairs]),
    )


def read_rows(path: str | Path) -> list[dict]:
    """The lines of a `treesearch run` results file; SaveFileError naming the line that is not one."""
    p = Path(path)
    if not p.is_file():
        raise SaveFileError(f"{path}: no such results file; give a file written by `treesearch run --out`")
    rows = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            int(row["index"])
        except (ValueError, KeyError, TypeError):
            raise SaveFileError(
                f"{path} line {n} is not a result line; give a file written by `treesearch run --out`"
            ) from None
        rows.append(row)
    return rows


def report(c: Comparison, name_a: str, name_b: str) -> list[str]:
    """The comparison as the lines `treesearch compare` prints."""
    n = c.rows
    la, ha = wilson(c.both + c.only_a, n)
    lb, hb = wilson(c.both + c.only_b, n)
    ratio = f" (A/B {c.tokens_a / c.tokens_b:.2f}x tokens)" if c.tokens_b else ""
    return [
        f"A = {name_a}, B = {name_b}: {n} common rows searched by both",
        f"both solved {c.both}, only A {c.only_a}, only B {c.only_b}, neither {c.neither}",
        f"accuracy: A {c.accuracy_a:.3f} (95% CI {la:.3f}-{ha:.3f}), B {c.accuracy_b:.3f} "
        f"(95% CI {lb:.3f}-{hb:.3f})",
        f"difference A - B: {c.difference:+.3f} (95% CI {c.difference_low:+.3f} to {c.difference_high:+.3f}, "
        "Newcombe's paired score interval)",
        f"McNemar's exact test (two-sided, on the {c.only_a + c.only_b} rows only one solved): "
        f"p = {c.p_value:.4g}",
        f"cost per problem: A {c.tokens_a:.0f} tokens, {c.seconds_a:.2f} s; B {c.tokens_b:.0f} tokens, "
        f"{c.seconds_b:.2f} s{ratio}",
    ]
