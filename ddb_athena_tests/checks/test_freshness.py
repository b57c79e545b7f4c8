"""The freshness check of books_iceberg: red past two minutes without a materialization, green within."""

import time

from dagster import AssetKey, AssetMaterialization, AssetSelection, Definitions, define_asset_job, instance_for_test
from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
from dagster._core.events.log import EventLogEntry

from ddb_athena.assets.books import books_iceberg
from ddb_athena.checks.books import BOOKS_FRESHNESS, books_freshness_checks
from ddb_athena.resources import resources_from_settings
from ddb_athena.settings import Settings


def materialized(instance, seconds_ago: float) -> None:
    """Records a books_iceberg materialization as of `seconds_ago` (the event log keeps the time)."""
    event = DagsterEvent(
        DagsterEventType.ASSET_MATERIALIZATION.value,
        "books_sync",
        event_specific_data=StepMaterializationData(AssetMaterialization(asset_key=AssetKey("books_iceberg"))),
    )
    instance.store_event(
        EventLogEntry(error_info=None, level="INFO", user_message="", run_id="earlier-run", timestamp=time.time() - seconds_ago, dagster_event=event)
    )


def freshness_passes(instance) -> bool:
    only_freshness = define_asset_job("freshness_only", selection=AssetSelection.checks(*books_freshness_checks))
    job = Definitions(
        assets=[books_iceberg], asset_checks=books_freshness_checks, jobs=[only_freshness], resources=resources_from_settings(Settings.from_env())
    ).resolve_job_def("freshness_only")
    result = job.execute_in_process(instance=instance)
    (evaluation,) = result.get_asset_check_evaluations()
    return evaluation.passed


def test_freshness_fails_past_two_minutes_and_passes_within_them():
    assert BOOKS_FRESHNESS.total_seconds() == 120
    with instance_for_test() as instance:
        assert not freshness_passes(instance)  # never materialized
        materialized(instance, seconds_ago=150)
        assert not freshness_passes(instance)
        materialized(instance, seconds_ago=30)
        assert freshness_passes(instance)
