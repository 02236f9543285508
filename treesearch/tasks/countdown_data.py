"""Countdown instances: a seeded generator and an exact solver. Every instance it writes comes with
a solution the solver found, so each one is solvable.

    scripts/countdown-data --seed 0 --sizes 3 4 5 --count 200 \\
        --out treesearch/tasks/data/countdown/countdown.jsonl

An instance of size n: n numbers drawn from 1..13 (with repeats, like cards), and a target drawn
uniformly from the whole numbers in 10..100 that the numbers reach using each of them exactly once
(numbers whose reachable set has none are drawn again). All arithmetic is exact (fractions).
"""

from __future__ import annotations

import random
from fractions import Fraction
from functools import cache

LOW, HIGH = 1, 13  # numbers drawn from LOW..HIGH
TARGETS = range(10, 101)  # targets drawn from the reachable whole numbers here


def _combine(a: tuple[Fraction, str], b: tuple[Fraction, str]) -> list[tuple[Fraction, str]]:
    """Every (value, expression) of one operation on a and b (both orders for - and /)."""
    (x, ex), (y, ey) = a, b
    ex, ey = _wrap(ex), _wrap(ey)
    out = [(x + y, f"{ex} + {ey}"), (x * y, f"{ex} * {ey}"), (x - y, f"{ex} - {ey}"), (y - x, f"{ey} - {ex}")]
    if y != 0:
        out.append((x / y, f"{ex} / {ey}"))
    if x != 0:
        out.append((y / x, f"{ey} / {ex}"))
    return out


def _wrap(expr: str) -> str:
    return expr if expr.isdigit() else f"({expr})"


@cache
def reachable(numbers: tuple[int, ...]) -> dict[Fraction, str]:
    """Every value reachable from `numbers` (sorted) using each exactly once, with one expression
    for it. An expression's last operation splits the numbers in two groups, so the values are
    those of every split (each group's values, memoized) combined by one operation; the first
    expression found for a value is kept, in a fixed order: deterministic."""
    if len(numbers) == 1:
        return {Fraction(numbers[0]): str(numbers[0])}
    found: dict[Fraction, str] = {}
    n = len(numbers)
    seen: set[tuple[int, ...]] = set()
    for mask in range(1, 2 ** (n - 1)):  # the group holding the last number is the complement
        left = tuple(numbers[i] for i in range(n) if mask >> i & 1)
        if left in seen:  # the same group of values splits the same way
            continue
        seen.add(left)
        right = tuple(numbers[i] for i in range(n) if not mask >> i & 1)
        for x, ex in reachable(left).items():
            for y, ey in reachable(right).items():
                for value, expr in _combine((x, ex), (y, ey)):
                    found.setdefault(value, expr)
    return found


def solve(numbers: list[int] | tuple[int, ...], target: int) -> str | None:
    """An expression reaching `target` from `numbers`, each used once; None when none does."""
    return reachable(tuple(sorted(numbers))).get(Fraction(target))


def generate(seed: int, size: int, count: int) -> list[dict]:
    """`count` instances of `size` numbers from Random(seed, size): {"target", "numbers", "solution"}."""
    rng = random.Random(f"countdown-{seed}-{size}")
    out: list[dict] = []
    seen: set[tuple] = set()
    while len(out) < count:
        numbers = [rng.randint(LOW, HIGH) for _ in range(size)]
        values = reachable(tuple(sorted(numbers)))
        targets = [t for t in TARGETS if Fraction(t) in values]
        if not targets:
            continue
        target = rng.choice(targets)
        key = (tuple(sorted(numbers)), target)
        if key in seen:
            continue
        seen.add(key)
        out.append(
            {"target": target, "numbers": numbers, "solution": f"{values[Fraction(target)]} = {target}"}
        )
    return out
