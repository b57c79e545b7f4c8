"""The freshness benchmark's report: the figure the CPU targets are judged by over an hour."""

import pytest

from ddb_athena_bench.freshness import SERIES_EVERY_SECONDS, busiest_hour


def test_the_busiest_hour_is_the_60_minutes_that_hold_a_run_start_and_none_under_an_hour():
    step = SERIES_EVERY_SECONDS / 60
    # 9 CPU-s a minute, and 60 more in the 2 minutes of a run's start at minute 70.
    series, spent = [], 0.0
    for point in range(46):
        minute = point * step
        series.append({"minute": minute, "sync_cpu": spent})
        spent += 9 * step + (60 if 68 <= minute < 70 else 0)
    assert busiest_hour(series, "sync_cpu") == pytest.approx(9 + 1)  # any hour holding the start: 540 + 60 CPU-s
    assert busiest_hour(series[:30], "sync_cpu") is None  # 58 minutes
    assert busiest_hour(series[:31], "sync_cpu") == pytest.approx(9)  # the first hour, before the start
