import re
import time
from datetime import UTC

import pytest
from dagster import DagsterRunStatus, RunRequest, SkipReason, build_schedule_context, build_sensor_context, instance_for_test

from ddb_athena.lib.declarations import declared_tables
from ddb_athena.lib.resources import SyncSettings
from ddb_athena.lib.resources import sync_settings as settings_from
from ddb_athena.lib.run_capacity import capacity_tags
from ddb_athena.lib.settings import Settings
from ddb_athena.streamed.handover import INTERRUPTED_TAG
from ddb_athena.streamed.schedules import sync_run_tags, sync_successor_on_interruption, upkeep_when_due
from ddb_athena_tests.books_and_orders import books_every_minute
from ddb_athena_tests.dagster_helpers import add_run, fail, start


def sync_settings(sync_run_minutes: float = 60) -> SyncSettings:
    """The schedule's resource as the code location makes it: from the environment (a run's resources must name the
    deployment's tables), with this test's run length and interval."""
    return settings_from(Settings.from_env(), sync_run_minutes=sync_run_minutes, merge_interval_seconds=10)


def tick(instance, sync_run_minutes: float = 60):
    with build_schedule_context(instance=instance, resources={"sync": sync_settings(sync_run_minutes)}) as context:
        return books_every_minute(context)


def test_books_sync_is_launched_every_minute_with_a_max_runtime_past_its_length():
    assert books_every_minute.cron_schedule == "* * * * *"
    with instance_for_test() as instance:
        request = tick(instance)
    assert isinstance(request, RunRequest)
    # Run monitoring ends a run still going 10 minutes after its planned hour (it hangs); the next tick replaces it.
    assert int(request.tags["dagster/max_runtime"]) == 70 * 60 + 10


def test_a_tick_waits_while_the_sync_runs_and_launches_one_successor_in_its_last_minute_and_a_half():
    with instance_for_test() as instance:
        # (QUEUED runs need a full code-location origin to be created; NOT_STARTED stands in for a pending run.)
        queued = add_run(instance)
        assert isinstance(tick(instance), SkipReason)
        instance.delete_run(queued.run_id)
        running = add_run(instance, status=DagsterRunStatus.STARTED)
        assert isinstance(tick(instance), SkipReason)  # just started: an hour to go
        assert isinstance(tick(instance, sync_run_minutes=1), RunRequest)  # ends within 90 s: launch the successor
        successor = add_run(instance)
        assert isinstance(tick(instance, sync_run_minutes=1), SkipReason)  # never a second successor
        for run in (successor, running):
            instance.delete_run(run.run_id)
        # While one hands over to the next, the newest decides (two-minute runs here): past the older one's planned
        # end, no other; the newest near its own end (it took over late), its successor, or it would end with none.
        older = start(instance, add_run(instance, status=DagsterRunStatus.STARTED), at=time.time() - 170)
        newest = start(instance, add_run(instance, status=DagsterRunStatus.STARTED), at=time.time() - 20)
        assert tick(instance, sync_run_minutes=2).skip_message == "the books_sync run is running"
        instance.delete_run(newest.run_id)
        newest = start(instance, add_run(instance, status=DagsterRunStatus.STARTED), at=time.time() - 40)
        assert isinstance(tick(instance, sync_run_minutes=2), RunRequest)
        for run in (older, newest):
            instance.delete_run(run.run_id)
        # A finished run, or another job's run, does not hold the schedule back.
        add_run(instance, status=DagsterRunStatus.SUCCESS)
        add_run(instance, "books_source_cleanup", DagsterRunStatus.STARTED)
        assert isinstance(tick(instance), RunRequest)


def test_a_sync_that_keeps_failing_is_started_less_and_less_often_until_one_succeeds_or_is_terminated():
    def failed(instance, seconds_ago: float):
        started = start(instance, add_run(instance, status=DagsterRunStatus.STARTED), at=time.time() - seconds_ago - 30)
        return fail(instance, started, at=time.time() - seconds_ago)

    def backing_off(instance) -> tuple[int, float]:
        found = re.fullmatch(r"the last (\d+) books_sync runs failed: the next starts in (\d+) s \(see the newest's log\)", tick(instance).skip_message)
        return int(found[1]), float(found[2])

    with instance_for_test() as instance:
        failed(instance, seconds_ago=5)
        assert isinstance(tick(instance), RunRequest)  # one failure (a crash): replaced at the next tick, as always
        failed(instance, seconds_ago=4)
        assert backing_off(instance) == (2, pytest.approx(56, abs=3))  # two in a row: a minute from the newest's end
        for seconds_ago in (400, 300, 200):  # five in a row, the newest 200 s ago: 8 minutes from it
            failed(instance, seconds_ago)
        assert backing_off(instance) == (5, pytest.approx(280, abs=3))
        for seconds_ago in range(300, 120, -10):  # however many, half an hour at most
            failed(instance, seconds_ago)
        assert backing_off(instance) == (12, pytest.approx(1670, abs=3))  # the twelve it reads
        # Someone terminated the newest (to roll the sync, say): the streak is over, as after a success.
        instance.report_run_canceled(add_run(instance, status=DagsterRunStatus.STARTED))
        assert isinstance(tick(instance), RunRequest)


def test_no_sync_starts_while_every_streamed_table_has_another_writer_waiting_or_running():
    streamed = [name for name, table in declared_tables().items() if table.kind == "streamed"]
    with instance_for_test() as instance:
        writers = [add_run(instance, f"{name}_bootstrap", DagsterRunStatus.STARTED, pools={f"{name}_writer"}) for name in streamed]
        skipped = tick(instance).skip_message
        assert all(writer.run_id in skipped for writer in writers)
        # One table's writer gone: the sync starts (and leaves the others to their writers, streamed/assets.py).
        instance.delete_run(writers[-1].run_id)
        assert isinstance(tick(instance), RunRequest)


def test_orders_run_daily_at_the_configured_hour_for_the_day_that_ended():
    from datetime import datetime, time, timedelta

    from ddb_athena.definitions import defs

    orders_daily_schedule = defs.resolve_schedule_def("orders_daily_schedule")  # partitions come from the assets
    assert orders_daily_schedule.cron_schedule == "0 2 * * *" and orders_daily_schedule.execution_timezone in (None, "UTC")
    with instance_for_test() as instance:
        today = datetime.now(UTC).date()
        tick = datetime.combine(today, time(2), tzinfo=UTC)
        context = build_schedule_context(instance=instance, scheduled_execution_time=tick)
        (request,) = orders_daily_schedule.evaluate_tick(context).run_requests
    assert request.partition_key == (today - timedelta(days=1)).isoformat()


def test_schedule_hour_and_start_date_come_from_the_environment():
    import pytest

    from ddb_athena.lib.settings import Settings, SettingsError

    orders = Settings.from_env({"DDB_ATHENA_ORDERS_SCHEDULE_HOUR": "5", "DDB_ATHENA_ORDERS_START_DATE": "2025-01-31"}).exported["orders"]
    assert (orders.schedule_hour, orders.start_date.isoformat()) == (5, "2025-01-31")
    for bad in ({"DDB_ATHENA_ORDERS_SCHEDULE_HOUR": "24"}, {"DDB_ATHENA_ORDERS_START_DATE": "31/01/2025"}):
        with pytest.raises(SettingsError):
            Settings.from_env(bad)


def successor_tick(instance):
    with build_sensor_context(instance=instance, resources={"sync": sync_settings()}) as context:
        return sync_successor_on_interruption(context)


def test_an_interrupted_sync_run_has_its_successor_launched_at_once_and_only_once():
    with instance_for_test() as instance:
        running = start(instance, add_run(instance, status=DagsterRunStatus.STARTED))
        assert isinstance(successor_tick(instance), SkipReason)  # running, not interrupted: the schedule's business
        instance.add_run_tags(running.run_id, {INTERRUPTED_TAG: "2026-11-28T10:00:00+00:00"})
        request = successor_tick(instance)
        assert isinstance(request, RunRequest) and request.run_key == f"successor-of-{running.run_id}"
        assert request.tags == sync_run_tags(sync_settings())  # a sync run as the schedule launches them
        add_run(instance)  # the successor, on its way
        assert isinstance(successor_tick(instance), SkipReason)


def upkeep_tick(instance, counted_from: float | None, maintenance_interval_minutes: float = 15):
    """The upkeep sensor's look with `counted_from` as its cursor: (its run requests, its new cursor)."""
    sync = settings_from(Settings.from_env(), maintenance_interval_minutes=maintenance_interval_minutes)
    cursor = str(counted_from) if counted_from is not None else None
    with build_sensor_context(instance=instance, resources={"sync": sync}, cursor=cursor) as context:
        result = upkeep_when_due(context)
    return result.run_requests, float(result.cursor)


def test_the_upkeep_run_is_launched_every_maintenance_interval_on_spot_and_never_two_at_once():
    with instance_for_test() as instance:
        now = time.time()
        requested, cursor = upkeep_tick(instance, None)
        # First look now: the first run one interval later, not at every restart of a new deployment's daemon.
        assert requested == [] and now <= cursor <= time.time()

        assert upkeep_tick(instance, now - 14 * 60) == ([], now - 14 * 60)
        requested, cursor = upkeep_tick(instance, now - 15 * 60)
        # One run for every streamed table (its ops, one a table), on Spot as the sync.
        assert len(requested) == 1 and cursor >= now
        assert requested[0].job_name is None and requested[0].tags == capacity_tags(sync_settings().run_capacity)

        # A run still on its way or running: none beside it; the next look after it ends launches one.
        running = start(instance, add_run(instance, "streamed_upkeep", status=DagsterRunStatus.STARTED))
        assert upkeep_tick(instance, now - 20 * 60) == ([], now - 20 * 60)
        fail(instance, running)
        # The interval is read at each look (the environment's setting, not the code's).
        assert upkeep_tick(instance, now - 3 * 60)[0] == []
        assert len(upkeep_tick(instance, now - 3 * 60, maintenance_interval_minutes=2)[0]) == 1
