from dagster import DagsterRunStatus, RunRequest, SkipReason, build_schedule_context, instance_for_test
from dagster._core.storage.dagster_run import DagsterRun

from ddb_athena.jobs import BOOKS_CONCURRENCY_TAG
from ddb_athena.schedules import books_every_minute, books_maintenance_hourly


def test_books_runs_every_minute_and_carries_the_concurrency_tag():
    assert books_every_minute.cron_schedule == "* * * * *"
    with instance_for_test() as instance:
        request = books_every_minute(build_schedule_context(instance=instance))
    assert isinstance(request, RunRequest) and request.tags == BOOKS_CONCURRENCY_TAG


def test_a_tick_is_skipped_while_a_books_run_is_queued_or_running():
    with instance_for_test() as instance:
        # (QUEUED runs need a full code-location origin to be created; NOT_STARTED stands in for a pending run.)
        for status in (DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTED):
            run = instance.add_run(DagsterRun(job_name="books_sync", status=status))
            assert isinstance(books_every_minute(build_schedule_context(instance=instance)), SkipReason)
            instance.delete_run(run.run_id)
        # A finished run, or another job's run, does not hold the schedule back.
        instance.add_run(DagsterRun(job_name="books_sync", status=DagsterRunStatus.SUCCESS))
        instance.add_run(DagsterRun(job_name="source_cleanup", status=DagsterRunStatus.STARTED))
        assert isinstance(books_every_minute(build_schedule_context(instance=instance)), RunRequest)


def test_maintenance_runs_hourly_with_the_same_tag():
    with instance_for_test() as instance:
        assert books_maintenance_hourly(build_schedule_context(instance=instance)).tags == BOOKS_CONCURRENCY_TAG
