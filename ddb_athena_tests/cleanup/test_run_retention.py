"""cleanup/run_retention.py: runs past the retention are deleted with their events, but partitioned and unfinished ones."""

from datetime import UTC, datetime, timedelta

from dagster import DagsterEvent, DagsterRunStatus, instance_for_test

from ddb_athena.cleanup.run_retention import delete_runs_past_retention
from ddb_athena_tests.dagster_helpers import add_run


def test_finished_runs_past_the_retention_go_with_their_events_but_partitioned_and_unfinished_ones_stay():
    with instance_for_test() as instance:
        finished = add_run(instance, status=DagsterRunStatus.SUCCESS)
        instance.report_dagster_event(DagsterEvent("PIPELINE_SUCCESS", job_name=finished.job_name), run_id=finished.run_id)
        add_run(instance, "books_source_cleanup", DagsterRunStatus.FAILURE)
        running = add_run(instance, status=DagsterRunStatus.STARTED)
        loaded = add_run(instance, "orders_athena", DagsterRunStatus.SUCCESS, tags={"dagster/partition": "2026-10-01"})
        now = datetime.now(UTC)
        assert delete_runs_past_retention(instance, 30, now + timedelta(days=29))[0] == 0
        deleted, cutoff = delete_runs_past_retention(instance, 30, now + timedelta(days=31))
        assert deleted == 2 and cutoff > now
        assert {run.run_id for run in instance.get_runs()} == {running.run_id, loaded.run_id}
        assert instance.all_logs(finished.run_id) == []
