"""The Dagster code location: `dagster dev -m ddb_athena.definitions` (or workspace.yaml)."""

import warnings

from dagster import DefaultSensorStatus, Definitions, SupersessionWarning, build_sensor_for_freshness_checks, in_process_executor

from ddb_athena.alerts.sensors import alert_on_failed_run, alert_on_red_checks
from ddb_athena.cleanup.jobs import books_source_cleanup, orders_export_cleanup
from ddb_athena.cleanup.sensors import cleanup_after_materialization
from ddb_athena.exported.assets import orders_athena, orders_export
from ddb_athena.exported.checks import orders_freshness_checks, orders_unique_order_id
from ddb_athena.exported.jobs import orders_daily
from ddb_athena.exported.schedules import orders_daily_schedule
from ddb_athena.lib.settings import Settings
from ddb_athena.resources import resources_from_settings
from ddb_athena.streamed.assets import sync_books
from ddb_athena.streamed.checks import (
    books_backlog,
    books_capture_failures,
    books_files_compact,
    books_freshness_checks,
    books_quarantine_empty,
    books_row_count_parity,
    books_unique_id,
)
from ddb_athena.streamed.jobs import books_bootstrap, books_key_parity, books_maintenance, books_sync_job
from ddb_athena.streamed.schedules import books_every_minute, books_key_parity_daily

with warnings.catch_warnings():  # see ddb_athena/streamed/checks.py
    warnings.simplefilter("ignore", category=SupersessionWarning)
    freshness_sensor = build_sensor_for_freshness_checks(
        freshness_checks=[*books_freshness_checks, *orders_freshness_checks], default_status=DefaultSensorStatus.RUNNING
    )

defs = Definitions(
    assets=[sync_books, orders_export, orders_athena],
    asset_checks=[
        *books_freshness_checks,
        books_backlog,
        books_capture_failures,
        books_quarantine_empty,
        books_unique_id,
        books_row_count_parity,
        books_files_compact,
        *orders_freshness_checks,
        orders_unique_order_id,
    ],
    jobs=[books_sync_job, books_bootstrap, books_key_parity, books_source_cleanup, orders_export_cleanup, books_maintenance, orders_daily],
    schedules=[books_every_minute, books_key_parity_daily, orders_daily_schedule],
    sensors=[cleanup_after_materialization, freshness_sensor, alert_on_failed_run, alert_on_red_checks],
    resources=resources_from_settings(Settings.from_env()),
    # Every job, `dagster asset materialize` included, runs in one process: one SparkSession per run.
    executor=in_process_executor,
)
