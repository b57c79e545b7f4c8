"""The Dagster code location: `dagster dev -m ddb_athena.definitions` (or workspace.yaml). Every streamed table declared
in ddb_athena/tables.toml brings its assets, checks, jobs and schedules (streamed/); orders its own (exported/)."""

import warnings

from dagster import DefaultSensorStatus, Definitions, SupersessionWarning, build_sensor_for_freshness_checks, in_process_executor

from ddb_athena.alerts.sensors import alert_on_failed_run, alert_on_red_checks
from ddb_athena.cleanup.jobs import SOURCE_CLEANUPS, orders_export_cleanup
from ddb_athena.cleanup.sensors import cleanup_after_materialization
from ddb_athena.exported.assets import orders_athena, orders_export
from ddb_athena.exported.checks import orders_freshness_checks, orders_unique_order_id
from ddb_athena.exported.jobs import orders_daily
from ddb_athena.exported.schedules import orders_daily_schedule
from ddb_athena.lib.settings import Settings
from ddb_athena.resources import resources_from_settings
from ddb_athena.streamed.assets import SYNC_ASSETS
from ddb_athena.streamed.checks import CHECKS
from ddb_athena.streamed.jobs import JOBS, books_sync_job
from ddb_athena.streamed.schedules import KEY_PARITY_SCHEDULES, books_every_minute

streamed_freshness_checks = [check for checks in CHECKS.values() for check in checks.freshness]
with warnings.catch_warnings():  # see ddb_athena/streamed/checks.py
    warnings.simplefilter("ignore", category=SupersessionWarning)
    freshness_sensor = build_sensor_for_freshness_checks(
        freshness_checks=[*streamed_freshness_checks, *orders_freshness_checks], default_status=DefaultSensorStatus.RUNNING
    )

defs = Definitions(
    assets=[*SYNC_ASSETS.values(), orders_export, orders_athena],
    asset_checks=[*(check for checks in CHECKS.values() for check in checks.all), *orders_freshness_checks, orders_unique_order_id],
    jobs=[
        books_sync_job,
        *(job for jobs in JOBS.values() for job in (jobs.bootstrap, jobs.key_parity, jobs.maintenance)),
        *SOURCE_CLEANUPS.values(),
        orders_export_cleanup,
        orders_daily,
    ],
    schedules=[books_every_minute, *KEY_PARITY_SCHEDULES.values(), orders_daily_schedule],
    sensors=[cleanup_after_materialization, freshness_sensor, alert_on_failed_run, alert_on_red_checks],
    resources=resources_from_settings(Settings.from_env()),
    # Every job, `dagster asset materialize` included, runs in one process: one SparkSession per run.
    executor=in_process_executor,
)
