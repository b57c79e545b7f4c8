"""Schedules: the books sync's launcher and watchdog (every minute it starts a sync run unless one is queued or
running, so a run that ended or crashed is replaced within a minute; the run maintains its table itself), orders
daily at a configurable hour (UTC) for the day that just ended."""

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

from ddb_athena.jobs import BOOKS_CONCURRENCY_TAG, ORDERS_CONCURRENCY_TAG, books_sync_job, orders_daily
from ddb_athena.resources import SyncSettings
from ddb_athena.settings import Settings

# Run monitoring (dagster.yaml) ends a sync run that is still going this long after its planned end: it hangs.
SYNC_RUN_SLACK_MINUTES = 10

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


def sync_run_tags(sync: SyncSettings) -> dict[str, str]:
    max_runtime = (sync.sync_run_minutes + SYNC_RUN_SLACK_MINUTES) * 60 + sync.merge_interval_seconds
    return {**BOOKS_CONCURRENCY_TAG, "dagster/max_runtime": str(int(max_runtime))}


@schedule(job=books_sync_job, cron_schedule="* * * * *", default_status=DefaultScheduleStatus.RUNNING)
def books_every_minute(context: ScheduleEvaluationContext, sync: SyncSettings):
    # One sync run at a time: it loops for sync_run_minutes; this tick only replaces it once it has ended.
    if books_run_in_flight(context, books_sync_job.name):
        return SkipReason("a books_sync run is still queued or running")
    return RunRequest(tags=sync_run_tags(sync))


# Each tick runs the partition of the previous day, once that day has ended.
orders_daily_schedule = build_schedule_from_partitioned_job(
    orders_daily,
    name="orders_daily_schedule",
    hour_of_day=Settings.from_env().orders_schedule_hour,
    minute_of_hour=0,
    tags=ORDERS_CONCURRENCY_TAG,
    default_status=DefaultScheduleStatus.RUNNING,
)
