import itertools
from math import comb

import pytest

from isoflop_cli.recipe.evaluate import best_at_k, summarize, worst_at_k


def brute(m: int, c: int, k: int):
    """Enumerate every k-subset of m samples of which c are correct."""
    samples = [1] * c + [0] * (m - c)
    subsets = list(itertools.combinations(range(m), k))
    any_ok = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    all_ok = sum(all(samples[i] for i in s) for s in subsets) / len(subsets)
    return any_ok, all_ok


@pytest.mark.parametrize("m", [1, 4, 6, 8])
def test_pass_and_worst_at_k_match_enumeration(m):
    for k in range(1, m + 1):
        for c in range(m + 1):
            any_ok, all_ok = brute(m, c, k)
            assert best_at_k(m, c, k) == pytest.approx(any_ok)
            assert worst_at_k(m, c, k) == pytest.approx(all_ok)


def test_summarize_hand_computed():
    # Two problems, m = 4, k = 2: c = 1 and c = 4.
    out = summarize([1, 4], m=4, k=2)
    assert out["val_avg@k"] == pytest.approx(5 / 8)
    assert out["val_best@k"] == pytest.approx(((1 - comb(3, 2) / comb(4, 2)) + 1) / 2)  # (0.5 + 1) / 2
    assert out["val_worst@k"] == pytest.approx((0 + 1) / 2)
