"""The Dagster code location: `dagster dev -m ddb_athena.definitions` (or workspace.yaml). Every table declared in
ddb_athena/tables.toml brings its assets, checks, jobs and schedules: a streamed table's from streamed/, an exported
table's from exported/. The sync job and its schedule exist while a streamed table is declared."""

from dagster import Definitions, in_process_executor

from ddb_athena.alerts.sensors import alert_on_failed_run, alert_on_red_checks
from ddb_athena.cleanup.jobs import EXPORT_CLEANUPS, SOURCE_CLEANUPS
from ddb_athena.cleanup.run_retention import runs_past_retention
from ddb_athena.cleanup.sensors import cleanup_after_materialization
from ddb_athena.exported.assets import EXPORTED
from ddb_athena.exported.checks import EXPORTED_CHECKS
from ddb_athena.exported.jobs import DAILY_JOBS
from ddb_athena.exported.schedules import DAILY_SCHEDULES
from ddb_athena.lib.freshness import freshness_sensor
from ddb_athena.lib.settings import Settings
from ddb_athena.resources import resources_from_settings
from ddb_athena.streamed.assets import SYNC_ASSETS
from ddb_athena.streamed.checks import CHECKS
from ddb_athena.streamed.jobs import JOBS, sync_job, upkeep_job
from ddb_athena.streamed.schedules import KEY_PARITY_SCHEDULES, sync_every_minute, sync_successor_on_interruption, upkeep_when_due

TABLE_CHECKS = [*CHECKS.values(), *EXPORTED_CHECKS.values()]
FRESHNESS = [checks.freshness_bound for checks in TABLE_CHECKS]
# Without a streamed table there is nothing to sync.
SYNC_JOBS, SYNC_SCHEDULES, SYNC_SENSORS = (
    ([sync_job, upkeep_job], [sync_every_minute], [sync_successor_on_interruption, upkeep_when_due]) if SYNC_ASSETS else ([], [], [])
)

defs = Definitions(
    assets=[*SYNC_ASSETS.values(), *(asset for assets in EXPORTED.values() for asset in (assets.export, assets.athena))],
    asset_checks=[check for checks in TABLE_CHECKS for check in checks.all],
    jobs=[
        *SYNC_JOBS,
        *(job for jobs in JOBS.values() for job in (jobs.bootstrap, jobs.key_parity, jobs.maintenance)),
        *SOURCE_CLEANUPS.values(),
        *EXPORT_CLEANUPS.values(),
        *DAILY_JOBS.values(),
    ],
    schedules=[*SYNC_SCHEDULES, *KEY_PARITY_SCHEDULES.values(), *DAILY_SCHEDULES.values()],
    sensors=[cleanup_after_materialization, runs_past_retention, freshness_sensor(FRESHNESS), alert_on_failed_run, alert_on_red_checks, *SYNC_SENSORS],
    resources=resources_from_settings(Settings.from_env()),
    # Every job, `dagster asset materialize` included, runs in one process: one SparkSession per run.
    executor=in_process_executor,
)
