"""``Histogram``: bucket placement (``le`` inclusive), the exact Prometheus text, bound checks and
consistent snapshots while another thread observes."""

from __future__ import annotations

import threading

import pytest

from freetoken.engine.histogram import Histogram, HistogramSnapshot

EXPECTED = """\
# HELP demo_seconds Demo latency in seconds.
# TYPE demo_seconds histogram
demo_seconds_bucket{le="0.25"} 2
demo_seconds_bucket{le="1.0"} 3
demo_seconds_bucket{le="4.0"} 4
demo_seconds_bucket{le="+Inf"} 5
demo_seconds_sum 14.875
demo_seconds_count 5
"""


def test_renders_cumulative_buckets_sum_and_count() -> None:
    hist = Histogram((0.25, 1.0, 4.0))
    for value in (0.125, 0.25, 0.5, 4.0, 10.0):  # a value equal to a bound falls into it
        hist.observe(value)
    snap = hist.snapshot()
    assert snap == HistogramSnapshot((0.25, 1.0, 4.0), (2, 1, 1, 1), 14.875)
    assert (snap.cumulative(), snap.count) == ((2, 3, 4, 5), 5)
    assert "\n".join(hist.render("demo_seconds", "Demo latency in seconds.")) + "\n" == EXPECTED


def test_empty_histogram_renders_zero_buckets() -> None:
    assert Histogram((10.0, 100.0)).render("speed", "Tokens/s.") == [
        "# HELP speed Tokens/s.", "# TYPE speed histogram",
        'speed_bucket{le="10.0"} 0', 'speed_bucket{le="100.0"} 0', 'speed_bucket{le="+Inf"} 0',
        "speed_sum 0.0", "speed_count 0"]
    assert Histogram((10.0, 100.0)).snapshot() == HistogramSnapshot.empty((10.0, 100.0))


@pytest.mark.parametrize("bounds", [(), (1.0, 1.0), (2.0, 1.0), (1.0, float("inf"))],
                         ids=["empty", "repeated", "decreasing", "infinite"])
def test_rejects_bad_bounds(bounds) -> None:
    with pytest.raises(ValueError, match="histogram bounds must be"):
        Histogram(bounds)


def test_rejects_nan() -> None:
    hist = Histogram((1.0,))
    with pytest.raises(ValueError, match="NaN"):
        hist.observe(float("nan"))
    assert hist.snapshot().count == 0


def test_snapshots_are_consistent_while_another_thread_observes() -> None:
    hist = Histogram((0.5, 2.0))
    done = threading.Event()

    def write() -> None:
        for _ in range(20_000):
            hist.observe(1.0)
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    seen = []
    while not done.is_set():
        snap = hist.snapshot()
        seen.append(snap)
        assert snap.sum == snap.count == snap.counts[1]  # every observation is 1.0
    writer.join()
    assert hist.snapshot() == HistogramSnapshot((0.5, 2.0), (0, 20_000, 0), 20_000.0)
    counts = [s.count for s in seen]
    assert counts == sorted(counts)
