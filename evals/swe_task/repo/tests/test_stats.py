import pytest

from tally import mean, median, spread


def test_mean():
    assert mean([2, 4, 9]) == 5


def test_median_odd_length():
    assert median([7, 1, 3]) == 3


def test_median_even_length():
    assert median([4, 1, 3, 2]) == 2.5
    assert median([10, 20]) == 15


def test_spread():
    assert spread([3, -2, 8]) == 10


def test_empty_sequence_is_rejected():
    with pytest.raises(ValueError, match="empty"):
        median([])
