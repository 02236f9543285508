"""Confidence intervals and the paired test that every report of a rate (accuracy, changed answers)
gives: Wilson's interval of one proportion, Newcombe's interval of a paired difference, and
McNemar's exact test of two runs over the same rows."""

from __future__ import annotations

import math
from fractions import Fraction


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k/n ((0, 0) for n = 0)."""
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    d = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, mid - half), min(1.0, mid + half))


def paired_difference(
    both: int, only_a: int, only_b: int, neither: int, z: float = 1.96
) -> tuple[float, float]:
    """95% interval of p_A - p_B over paired rows: Newcombe's hybrid score interval for paired data
    (Newcombe 1998, method 10), the Wilson limits (l, u) of each rate combined with their
    correlation phi:

        d = p_A - p_B,  p_A = (both + only_a) / n,  p_B = (both + only_b) / n
        low  = d - sqrt((p_A - l_A)^2 - 2 phi (p_A - l_A)(u_B - p_B) + (u_B - p_B)^2)
        high = d + sqrt((u_A - p_A)^2 - 2 phi (u_A - p_A)(p_B - l_B) + (p_B - l_B)^2)
        phi  = (both * neither - only_a * only_b) / sqrt((a+b)(c+d)(a+c)(b+d))   (0 when a margin is 0)

    (0, 0) for no rows."""
    a, b, c, d = both, only_a, only_b, neither
    n = a + b + c + d
    if n == 0:
        return (0.0, 0.0)
    pa, pb = (a + b) / n, (a + c) / n
    la, ua = wilson(a + b, n, z)
    lb, ub = wilson(a + c, n, z)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    phi = (a * d - b * c) / math.sqrt(margins) if margins else 0.0
    diff = pa - pb
    low = diff - math.sqrt(max(0.0, (pa - la) ** 2 - 2 * phi * (pa - la) * (ub - pb) + (ub - pb) ** 2))
    high = diff + math.sqrt(max(0.0, (ua - pa) ** 2 - 2 * phi * (ua - pa) * (pb - lb) + (pb - lb) ** 2))
    return (max(-1.0, low), min(1.0, high))


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided p-value of McNemar's exact test: under "the two runs solve as often", each of the
    m = only_a + only_b discordant rows goes either way with probability 1/2, so
    p = min(1, 2 * P(X <= min(only_a, only_b))), X ~ Binomial(m, 1/2); 1 when m = 0."""
    m = only_a + only_b
    if m == 0:
        return 1.0
    tail = sum(Fraction(math.comb(m, i), 2**m) for i in range(min(only_a, only_b) + 1))
    return float(min(Fraction(1), 2 * tail))
