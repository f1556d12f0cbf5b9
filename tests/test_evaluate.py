import math
from itertools import combinations

import pytest

from cleaner.evaluate import avg_at_k, pass_at_k, pass_at_k_estimate


def brute_pass_at_k(n, c, k):
    """The fraction of k-subsets of the n samples that hold at least one correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(combinations(samples, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize(
    ("n", "c", "k"), [(5, 0, 1), (5, 2, 1), (5, 2, 3), (6, 5, 2), (4, 4, 4), (8, 1, 8)]
)
def test_pass_at_k_is_the_subset_probability(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k))


def test_pass_at_k_rejects_impossible_inputs():
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="pass@5 needs at least 5"):
        pass_at_k(3, 1, 5)


def test_avg_at_k_and_interval_over_problems():
    correct = [[True, True, False, False], [True, True, True, True], [False] * 4]
    est = avg_at_k(correct)
    assert est.mean == pytest.approx(0.5) and est.problems == 3
    half = 1.959963984540054 * math.sqrt(((0.5 - 0.5) ** 2 + 0.5**2 + 0.5**2) / 2) / math.sqrt(3)
    assert (est.low, est.high) == pytest.approx((max(0, 0.5 - half), min(1, 0.5 + half)))
    assert pass_at_k_estimate(correct, 4).mean == pytest.approx(2 / 3)
    assert str(avg_at_k([[True], [False]])).startswith("50.0 [")
