"""Freshness checks: books_iceberg red past two minutes, orders_athena red past 26 hours, green within."""

import os
import time

import pytest
from dagster import AssetMaterialization, AssetSelection, Definitions, define_asset_job, instance_for_test
from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
from dagster._core.events.log import EventLogEntry

from ddb_athena.lib.settings import Settings
from ddb_athena.resources import resources_from_settings
from ddb_athena_tests.books_and_orders import BOOKS_FRESHNESS, ORDERS_FRESHNESS, books_freshness_checks, books_iceberg, orders_athena, orders_freshness_checks


def materialized(instance, asset, seconds_ago: float, partition: str | None = None) -> None:
    """Records a materialization of `asset` as of `seconds_ago` (the event log keeps the time)."""
    event = DagsterEvent(
        DagsterEventType.ASSET_MATERIALIZATION.value,
        "some_job",
        event_specific_data=StepMaterializationData(AssetMaterialization(asset_key=asset.key, partition=partition)),
    )
    instance.store_event(
        EventLogEntry(error_info=None, level="INFO", user_message="", run_id="earlier-run", timestamp=time.time() - seconds_ago, dagster_event=event)
    )


def freshness_passes(instance, asset, checks) -> bool:
    only_freshness = define_asset_job("freshness_only", selection=AssetSelection.checks(*checks))
    job = Definitions(assets=[asset], asset_checks=checks, jobs=[only_freshness], resources=resources_from_settings(Settings.from_env())).resolve_job_def(
        "freshness_only"
    )
    result = job.execute_in_process(instance=instance)
    (evaluation,) = result.get_asset_check_evaluations()
    return evaluation.passed


@pytest.mark.parametrize(
    "asset, checks, bound, partition",
    [(books_iceberg, books_freshness_checks, 120, None), (orders_athena, orders_freshness_checks, 26 * 3600, os.environ["DDB_ATHENA_ORDERS_START_DATE"])],
    ids=["books", "orders"],
)
def test_freshness_fails_past_the_bound_and_passes_within_it(asset, checks, bound, partition):
    assert {BOOKS_FRESHNESS.total_seconds(), ORDERS_FRESHNESS.total_seconds()} == {120, 26 * 3600}
    with instance_for_test() as instance:
        assert not freshness_passes(instance, asset, checks)  # never materialized
        materialized(instance, asset, seconds_ago=bound + 30, partition=partition)
        assert not freshness_passes(instance, asset, checks)
        materialized(instance, asset, seconds_ago=bound / 4, partition=partition)
        assert freshness_passes(instance, asset, checks)
