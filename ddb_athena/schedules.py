"""Schedules: books every minute (skipped while a books run is queued or in flight), maintenance hourly,
orders daily at a configurable hour (UTC) for the day that just ended."""

from dagster import (
    DagsterRunStatus,
    DefaultScheduleStatus,
    RunRequest,
    RunsFilter,
    ScheduleEvaluationContext,
    SkipReason,
    build_schedule_from_partitioned_job,
    schedule,
)

from ddb_athena.jobs import BOOKS_CONCURRENCY_TAG, ORDERS_CONCURRENCY_TAG, books_maintenance, books_sync_job, orders_daily
from ddb_athena.settings import Settings

_UNFINISHED = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


def books_run_in_flight(context: ScheduleEvaluationContext, job_name: str) -> bool:
    runs = context.instance.get_runs(filters=RunsFilter(job_name=job_name, statuses=_UNFINISHED), limit=1)
    return bool(runs)


@schedule(job=books_sync_job, cron_schedule="* * * * *", default_status=DefaultScheduleStatus.RUNNING)
def books_every_minute(context: ScheduleEvaluationContext):
    # A backlog of queued ticks would only merge empty batches; one queued run catches up on everything.
    if books_run_in_flight(context, books_sync_job.name):
        return SkipReason("a books_sync run is still queued or running")
    return RunRequest(tags=BOOKS_CONCURRENCY_TAG)


@schedule(job=books_maintenance, cron_schedule="17 * * * *", default_status=DefaultScheduleStatus.RUNNING)
def books_maintenance_hourly(context: ScheduleEvaluationContext):
    return RunRequest(tags=BOOKS_CONCURRENCY_TAG)


# Each tick runs the partition of the previous day, once that day has ended.
orders_daily_schedule = build_schedule_from_partitioned_job(
    orders_daily,
    name="orders_daily_schedule",
    hour_of_day=Settings.from_env().orders_schedule_hour,
    minute_of_hour=0,
    tags=ORDERS_CONCURRENCY_TAG,
    default_status=DefaultScheduleStatus.RUNNING,
)
