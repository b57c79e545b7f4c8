"""An exported table's schedule (<name>_daily_schedule): daily at its schedule_hour (UTC), for the day that just ended."""

from dagster import DefaultScheduleStatus, build_schedule_from_partitioned_job

from ddb_athena.exported.jobs import DAILY_JOBS
from ddb_athena.lib.settings import Settings

# Each tick runs the partition of the previous day, once that day has ended; the hours read once, with the code location.
_EXPORTED = Settings.from_env().exported
DAILY_SCHEDULES = {
    name: build_schedule_from_partitioned_job(
        job,
        name=f"{name}_daily_schedule",
        hour_of_day=_EXPORTED[name].schedule_hour,
        minute_of_hour=0,
        default_status=DefaultScheduleStatus.RUNNING,
    )
    for name, job in DAILY_JOBS.items()
}
