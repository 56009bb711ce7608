import pytest

from perf.pairs import median_pair_ratio, pair_ratios


def test_pair_ratios_are_slow_over_fast_per_pair():
    assert pair_ratios([2.0, 3.0, 4.0], [1.0, 1.0, 2.0]) == [2.0, 3.0, 2.0]


def test_median_of_the_pair_ratios_not_the_ratio_of_medians():
    slow, fast = [2.0, 9.0, 4.0, 4.4], [1.0, 3.0, 2.0, 1.0]
    assert median_pair_ratio(slow, fast) == pytest.approx((2.0 + 3.0) / 2)  # ratios 2, 3, 2, 4.4
    assert median_pair_ratio([3.0], [1.5]) == 2.0


@pytest.mark.parametrize("slow, fast", [([1.0], [1.0, 2.0]), ([], []), ([1.0], [0.0])])
def test_pair_ratios_refuse_unpaired_empty_or_zero(slow, fast):
    with pytest.raises(ValueError):
        pair_ratios(slow, fast)
