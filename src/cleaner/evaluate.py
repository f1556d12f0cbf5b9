"""Evaluation statistics (SPEC section 7): avg@k, pass@k and their 95% intervals. Pure functions.

Problems, not samples, are the unit of a benchmark: intervals come from the spread of per-problem
scores (a normal approximation over problems), so 30 AIME problems give honest, wide intervals
however many samples each has.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al., 2021): 1 - C(n-c, k)/C(n, k)."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1; got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem; got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


@dataclass(frozen=True)
class Estimate:
    mean: float
    low: float
    high: float
    problems: int

    def __str__(self) -> str:
        return f"{100 * self.mean:.1f} [{100 * self.low:.1f}, {100 * self.high:.1f}]"


def _estimate(per_problem: Sequence[float]) -> Estimate:
    p = len(per_problem)
    if p == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    mean = sum(per_problem) / p
    if p == 1:
        return Estimate(mean, 0.0, 1.0, 1)
    sd = math.sqrt(sum((x - mean) ** 2 for x in per_problem) / (p - 1))
    half = Z95 * sd / math.sqrt(p)
    return Estimate(mean, max(0.0, mean - half), min(1.0, mean + half), p)


def avg_at_k(correct: Sequence[Sequence[bool]]) -> Estimate:
    """pass@1 as the mean over samples (avg@k), averaged over problems; one list of verdicts a problem."""
    return _estimate([sum(c) / len(c) for c in correct if c])


def pass_at_k_estimate(correct: Sequence[Sequence[bool]], k: int) -> Estimate:
    """Mean unbiased pass@k over problems."""
    return _estimate([pass_at_k(len(c), sum(c), k) for c in correct if c])
