"""Running the real assets, checks and jobs against the emulator and the test SparkSession."""

from contextlib import contextmanager
from datetime import datetime
from unittest import mock

from dagster import DagsterEvent, DagsterInstance, DagsterRun, DagsterRunStatus, materialize
from dagster._core.storage.dagster_run import RunOpConcurrency

from ddb_athena.dev.simulate import BookSimulator
from ddb_athena.lib.settings import Settings
from ddb_athena.resources import resources_from_settings
from ddb_athena_tests.books_and_orders import sync_books as books_sync_assets


def local_resources(**sync_options) -> dict:
    return resources_from_settings(Settings.from_env(), **sync_options)


def sync_books(instance: DagsterInstance, config: dict | None = None, raise_on_error: bool = True, **sync_options):
    """A books_sync run of one cycle (unless `config` says otherwise), its checks evaluated in that cycle."""
    return materialize(
        [books_sync_assets],
        resources=local_resources(**sync_options),
        instance=instance,
        run_config={"ops": {"sync_books": {"config": {"run_minutes": 0, **(config or {})}}}},
        raise_on_error=raise_on_error,
    )


def add_run(instance, job_name: str = "books_sync", status: DagsterRunStatus = DagsterRunStatus.NOT_STARTED, pools: set[str] | None = None, tags=None):
    """A run record as the daemon or a launch leaves it (in `pools`, as a run of pooled steps is)."""
    concurrency = RunOpConcurrency(root_key_counts={pool: 1 for pool in pools}, has_unconstrained_root_nodes=False, all_pools=pools) if pools else None
    return instance.add_run(DagsterRun(job_name=job_name, status=status, run_op_concurrency=concurrency, tags=tags or {}))


def start(instance, run, at: float | None = None) -> DagsterRun:
    """The run's worker records its start (at `at`, by default now)."""
    instance.report_dagster_event(DagsterEvent("PIPELINE_START", job_name=run.job_name), run_id=run.run_id, timestamp=at)
    return instance.get_run_by_id(run.run_id)


def fail(instance, run, at: float | None = None) -> DagsterRun:
    """The run's worker records its failure (at `at`, by default now)."""
    instance.report_dagster_event(DagsterEvent("PIPELINE_FAILURE", job_name=run.job_name), run_id=run.run_id, timestamp=at)
    return instance.get_run_by_id(run.run_id)


def books_synced(settings: Settings, instance: DagsterInstance, *book_ids: str) -> None:
    """The books `book_ids` in DynamoDB, and a sync run that merged them."""
    simulator = BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"])
    for book_id in book_ids:
        simulator.insert(book_id)
    sync_books(instance)


def materializations_metadata(result, asset_name: str) -> list[dict]:
    """Every materialization of the asset in the run (a sync run records one per cycle), in order."""
    events = [e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == asset_name]
    return [{key: value.value for key, value in event.materialization.metadata.items()} for event in events]


def materialization_metadata(result, asset_name: str) -> dict:
    (metadata,) = materializations_metadata(result, asset_name)
    return metadata


def check_results(result) -> dict:
    return {evaluation.check_name: evaluation for evaluation in result.get_asset_check_evaluations()}


@contextmanager
def clock_at(moment: datetime):
    """Days later: Dagster's clock (which partitions exist) and the orders assets' clock read `moment`. The
    emulator keeps real time, so point-in-time recovery still reaches back only to when it was turned on."""
    from dagster._core.test_utils import freeze_time

    with freeze_time(moment), mock.patch("ddb_athena.exported.assets.utc_now", return_value=moment):
        yield
