"""The Dagster code location: `dagster dev -m ddb_athena.definitions` (or workspace.yaml)."""

import warnings

from dagster import DefaultSensorStatus, Definitions, SupersessionWarning, build_sensor_for_freshness_checks, in_process_executor

from ddb_athena.assets.books import books_iceberg, books_source
from ddb_athena.checks.books import books_backlog, books_freshness_checks, books_quarantine_empty, books_row_count_parity, books_unique_id
from ddb_athena.jobs import books_maintenance, books_sync_job, source_cleanup
from ddb_athena.resources import resources_from_settings
from ddb_athena.schedules import books_every_minute, books_maintenance_hourly
from ddb_athena.sensors import cleanup_after_materialization
from ddb_athena.settings import Settings

with warnings.catch_warnings():  # see ddb_athena/checks/books.py
    warnings.simplefilter("ignore", category=SupersessionWarning)
    freshness_sensor = build_sensor_for_freshness_checks(
        freshness_checks=books_freshness_checks, default_status=DefaultSensorStatus.RUNNING
    )

defs = Definitions(
    assets=[books_source, books_iceberg],
    asset_checks=[*books_freshness_checks, books_backlog, books_quarantine_empty, books_unique_id, books_row_count_parity],
    jobs=[books_sync_job, source_cleanup, books_maintenance],
    schedules=[books_every_minute, books_maintenance_hourly],
    sensors=[cleanup_after_materialization, freshness_sensor],
    resources=resources_from_settings(Settings.from_env()),
    # Every job, `dagster asset materialize` included, runs in one process: one SparkSession per run.
    executor=in_process_executor,
)
