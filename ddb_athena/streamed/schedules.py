"""The books schedules: the sync's launcher and watchdog (every minute it starts a sync run unless one is on its way or
running, so a run that ended or crashed is replaced within a minute; the run maintains its table itself), and the
daily key parity check."""

import time

from dagster import (
    DagsterRunStatus,
    DefaultScheduleStatus,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)

from ddb_athena.lib.resources import SyncSettings
from ddb_athena.lib.settings import Settings
from ddb_athena.streamed.handover import SYNC_RUN_SLACK_MINUTES, planned_end, waiting_writer
from ddb_athena.streamed.jobs import books_key_parity, books_sync_job

# A successor is launched this long before the running sync run's planned end: its process, its JVM (and on ECS its
# task) start while that run still cycles, which hands over once the successor is ready (streamed/handover.py).
SUCCESSOR_LEAD_SECONDS = 90

_WAITING = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING]
_RUNNING = [DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


def sync_run_tags(sync: SyncSettings) -> dict[str, str]:
    max_runtime = (sync.sync_run_minutes + SYNC_RUN_SLACK_MINUTES) * 60 + sync.merge_interval_seconds
    return {"dagster/max_runtime": str(int(max_runtime))}


@schedule(job=books_sync_job, cron_schedule="* * * * *", default_status=DefaultScheduleStatus.RUNNING)
def books_every_minute(context: ScheduleEvaluationContext, sync: SyncSettings):
    # One sync run at a time, which loops for sync_run_minutes. A tick starts one when none runs (first start, or
    # after a crash), or launches the successor of the newest one in its last minute and a half, one at a time. The
    # newest decides, not how many run: while one hands over to it, a short run's own end may already be near.
    job = books_sync_job.name
    writer = waiting_writer(context.instance)
    if writer is not None:
        return SkipReason(f"run {writer.run_id} ({writer.job_name}) writes the books table: the sync resumes after it")
    if context.instance.get_runs(filters=RunsFilter(job_name=job, statuses=_WAITING), limit=1):
        return SkipReason("a books_sync run is on its way")
    running = context.instance.get_run_records(filters=RunsFilter(job_name=job, statuses=_RUNNING), limit=10)
    ends = [planned_end(record, sync.sync_run_minutes) for record in running]
    if ends and max(ends) - time.time() > SUCCESSOR_LEAD_SECONDS:
        return SkipReason("the books_sync run is running")
    return RunRequest(tags=sync_run_tags(sync))


# The key parity check reads the whole DynamoDB table: once a day, not with the sync's cycles.
books_key_parity_daily = ScheduleDefinition(
    name="books_key_parity_daily",
    job=books_key_parity,
    cron_schedule=f"0 {Settings.from_env().parity_scan_hour} * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
)
