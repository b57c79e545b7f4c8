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


def test_markers_are_pending_until_the_table_shows_them_and_each_lag_is_its_own():
    from ddb_athena_bench.freshness import Markers

    class FakeDynamoDB:
        def __init__(self):
            self.items = []

        def put_item(self, TableName, Item):
            self.items.append((TableName, Item["id"]["S"]))

    dynamodb = FakeDynamoDB()
    markers = Markers(dynamodb, "books")
    markers.write("probe-0")
    markers.write("probe-1")
    assert dynamodb.items == [("books", "probe-0"), ("books", "probe-1")] and markers.pending == {"probe-0", "probe-1"}
    markers.look(lambda wanted: wanted & {"probe-1"})
    assert markers.pending == {"probe-0"} and len(markers.lags()) == 1 and markers.lags()[0] >= 0
    markers.look(lambda wanted: pytest.fail("asked again") if "probe-1" in wanted else wanted)
    assert markers.pending == set() and len(markers.lags()) == 2
