"""The streamed tables' schedules: the sync's launcher and watchdog (every minute it starts a sync run unless one is on
its way or running, so a run that ended or crashed is replaced within a minute; the run compacts its tables itself),
and each table's daily key parity check. Beside them, the sensor that launches a sync run's successor at once when ECS
stops the run's task (a Spot interruption: two minutes' warning, less than a minute tick and a task's start), and the
one that launches the tables' upkeep run (expiry, orphans) every maintenance interval."""

import time
from itertools import takewhile

from dagster import (
    DagsterRunStatus,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    schedule,
    sensor,
)

from ddb_athena.lib.resources import SyncSettings
from ddb_athena.lib.run_capacity import capacity_tags
from ddb_athena.lib.settings import Settings
from ddb_athena.streamed.assets import STREAMED
from ddb_athena.streamed.handover import INTERRUPTED_TAG, SYNC_RUN_SLACK_MINUTES, SYNC_SCHEDULE_NAME, SyncHandover, planned_end, waiting_writers
from ddb_athena.streamed.jobs import JOBS, sync_job, upkeep_job

# A successor is launched this long before the running sync run's planned end: its process, its JVM (and on ECS its
# task) start while that run still cycles, which hands over once the successor is ready (streamed/handover.py).
SUCCESSOR_LEAD_SECONDS = 90

_WAITING = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING]
_RUNNING = [DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
_ENDED = [DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED]
# A sync that keeps failing (an image that cannot start, a permission it lacks) is started again less and less often,
# each start a fresh task and image pull: after n >= 2 failed runs in a row, the next waits a minute doubled n-2 times,
# at most half an hour, from the last one's end. A single failure (a crash) is replaced at the next tick, as before;
# the first failure alerts (alerts/).
FAILURE_BACKOFF_FIRST_SECONDS = 60
FAILURE_BACKOFF_MAX_SECONDS = 1800


def failure_backoff(instance, job_name: str, now: float) -> tuple[int, float] | None:
    """(failed runs in a row, when the next may start) while that is still ahead; None to start now. A success or a
    run someone terminated ends the streak."""
    records = instance.get_run_records(filters=RunsFilter(job_name=job_name, statuses=_ENDED), limit=12)
    failures = list(takewhile(lambda record: record.dagster_run.status == DagsterRunStatus.FAILURE, records))
    if len(failures) < 2:
        return None
    wait = min(FAILURE_BACKOFF_FIRST_SECONDS * 2 ** (len(failures) - 2), FAILURE_BACKOFF_MAX_SECONDS)
    newest = failures[0]
    ready_at = (newest.end_time or newest.update_timestamp.timestamp()) + wait
    return (len(failures), ready_at) if now < ready_at else None


def sync_run_tags(sync: SyncSettings) -> dict[str, str]:
    max_runtime = (sync.sync_run_minutes + SYNC_RUN_SLACK_MINUTES) * 60 + sync.merge_interval_seconds
    return {"dagster/max_runtime": str(int(max_runtime)), **capacity_tags(sync.run_capacity)}


@schedule(name=SYNC_SCHEDULE_NAME, job=sync_job, cron_schedule="* * * * *", default_status=DefaultScheduleStatus.RUNNING)
def sync_every_minute(context: ScheduleEvaluationContext, sync: SyncSettings):
    # One sync run at a time, which loops for sync_run_minutes. A tick starts one when none runs (first start, or
    # after a crash), or launches the successor of the newest one in its last minute and a half, one at a time. The
    # newest decides, not how many run: while one hands over to it, a short run's own end may already be near.
    job = sync_job.name
    waiting = waiting_writers(context.instance)
    if all(assets.table.writer_pool in waiting for assets in STREAMED.values()):
        # A table with a writer of its own is given up by the sync for that writer's while: none is left to sync.
        runs = ", ".join(sorted(f"{run.run_id} ({run.job_name})" for run in waiting.values()))
        return SkipReason(f"every streamed table has another writer ({runs}): the sync resumes after them")
    if context.instance.get_runs(filters=RunsFilter(job_name=job, statuses=_WAITING), limit=1):
        return SkipReason(f"a {job} run is on its way")
    running = context.instance.get_run_records(filters=RunsFilter(job_name=job, statuses=_RUNNING), limit=10)
    ends = [planned_end(record, sync.sync_run_minutes) for record in running]
    if ends and max(ends) - time.time() > SUCCESSOR_LEAD_SECONDS:
        return SkipReason(f"the {job} run is running")
    if not running and (backoff := failure_backoff(context.instance, job, time.time())):
        failed, ready_at = backoff
        return SkipReason(f"the last {failed} {job} runs failed: the next starts in {ready_at - time.time():.0f} s (see the newest's log)")
    return RunRequest(tags=sync_run_tags(sync))


# How often the successor sensor looks (the daemon evaluates sensors every 5 s at most): well within a Spot interruption's
# two minutes, and it reads only the instance.
SUCCESSOR_SENSOR_SECONDS = 10


@sensor(job=sync_job, minimum_interval_seconds=SUCCESSOR_SENSOR_SECONDS, default_status=DefaultSensorStatus.RUNNING)
def sync_successor_on_interruption(context: SensorEvaluationContext, sync: SyncSettings):
    """A sync run whose task ECS is stopping tags itself (handover.INTERRUPTED_TAG) and syncs on; its successor is
    launched here at once, once per interrupted run (the run key), unless a newer sync run is on its way already."""
    for record in context.instance.get_run_records(filters=RunsFilter(job_name=sync_job.name, statuses=_RUNNING), limit=10):
        run = record.dagster_run
        if INTERRUPTED_TAG in run.tags and not SyncHandover(context.instance, run).newer_syncs():
            context.log.info(f"Sync run {run.run_id} is being stopped under it (since {run.tags[INTERRUPTED_TAG]}): launching its successor")
            return RunRequest(run_key=f"successor-of-{run.run_id}", tags=sync_run_tags(sync))
    return SkipReason("no running sync run is being stopped")


# The key parity check reads the whole DynamoDB table: once a day, not with the sync's cycles.
KEY_PARITY_SCHEDULES = {
    name: ScheduleDefinition(
        name=f"{name}_key_parity_daily",
        job=jobs.key_parity,
        cron_schedule=f"0 {Settings.from_env().parity_scan_hour} * * *",
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.RUNNING,
    )
    for name, jobs in JOBS.items()
}


# How often the upkeep sensor looks: a minute is well within any maintenance interval, and it reads only the instance.
UPKEEP_SENSOR_SECONDS = 60


@sensor(job=upkeep_job, minimum_interval_seconds=UPKEEP_SENSOR_SECONDS, default_status=DefaultSensorStatus.RUNNING)
def upkeep_when_due(context: SensorEvaluationContext, sync: SyncSettings):
    """Launches a streamed_upkeep run (every streamed table, one after the other) every maintenance_interval_minutes
    (read at each look: set in the environment, not in code), counted from the last launch, the first one interval
    after the sensor first looks; on Spot like the sync. Never while one is on its way or running: it then launches once
    that one is done. Its cursor holds the time counted from."""
    now, interval = time.time(), sync.maintenance_interval_minutes * 60
    counted_from = float(context.cursor) if context.cursor else now
    if now - counted_from < interval:
        return SensorResult(cursor=str(counted_from), skip_reason=f"upkeep not due yet (every {sync.maintenance_interval_minutes:g} minutes)")
    if context.instance.get_runs(filters=RunsFilter(job_name=upkeep_job.name, statuses=_WAITING + _RUNNING), limit=1):
        return SensorResult(cursor=str(counted_from), skip_reason=f"a {upkeep_job.name} run is on its way or running")
    return SensorResult(run_requests=[RunRequest(tags=capacity_tags(sync.run_capacity))], cursor=str(now))
