"""The instance's own upkeep: Dagster's retention settings purge schedule and sensor ticks only, and every sync cycle's
events (its materialization, its checks, its log lines) would stay in the database for good. Runs older than
`run_retention_days` are deleted, their events with them, a batch an hour, by a sensor: in the daemon, no run, no task.
Partitioned runs (an exported table's daily loads, backfills) are kept: their materializations are what the UI and a
backfill read as the partitions' status."""

from datetime import UTC, datetime, timedelta

from dagster import DagsterInstance, DefaultSensorStatus, RunsFilter, SensorEvaluationContext, SkipReason, sensor
from dagster._core.storage.dagster_run import FINISHED_STATUSES

from ddb_athena.lib.resources import SyncSettings

RETENTION_SENSOR_SECONDS = 3600
# Runs looked at an evaluation: deleting a sync run's events takes a while; the schedules start about 300 runs a day.
RETENTION_BATCH = 100
PARTITION_TAG = "dagster/partition"


def delete_runs_past_retention(instance: DagsterInstance, retention_days: int, now: datetime) -> tuple[int, datetime]:
    """Delete the oldest finished runs created before `now` less `retention_days`, but partitioned ones; (how many, the cutoff)."""
    cutoff = now - timedelta(days=retention_days)
    records = instance.get_run_records(filters=RunsFilter(statuses=FINISHED_STATUSES, created_before=cutoff), limit=RETENTION_BATCH, ascending=True)
    expired = [record.dagster_run.run_id for record in records if PARTITION_TAG not in record.dagster_run.tags]
    for run_id in expired:
        instance.delete_run(run_id)
    return len(expired), cutoff


@sensor(minimum_interval_seconds=RETENTION_SENSOR_SECONDS, default_status=DefaultSensorStatus.RUNNING)
def runs_past_retention(context: SensorEvaluationContext, sync: SyncSettings):
    deleted, cutoff = delete_runs_past_retention(context.instance, sync.run_retention_days, datetime.now(UTC))
    return SkipReason(f"deleted {deleted} runs and their events created before {cutoff:%Y-%m-%d %H:%M} UTC ({sync.run_retention_days} days' retention)")
