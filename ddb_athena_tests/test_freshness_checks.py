"""Freshness checks: books_iceberg red past two minutes, orders_athena red past 26 hours, green within; evaluated and
recorded by their sensor with no run."""

import os
import time

import pytest
from dagster import AssetCheckKey, AssetMaterialization, AssetSelection, Definitions, build_sensor_context, define_asset_job, instance_for_test
from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
from dagster._core.events.log import EventLogEntry

from ddb_athena.definitions import FRESHNESS
from ddb_athena.lib.freshness import FRESHNESS_CHECK_NAME, RECORD_EVERY, freshness_sensor
from ddb_athena.lib.settings import Settings
from ddb_athena.resources import resources_from_settings
from ddb_athena_tests.books_and_orders import (
    BOOKS,
    BOOKS_FRESHNESS,
    ORDERS_FRESHNESS,
    books_freshness_checks,
    books_iceberg,
    orders_athena,
    orders_freshness_checks,
)


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
    only_freshness = define_asset_job("freshness_only", selection=AssetSelection.checks(checks))
    job = Definitions(assets=[asset], asset_checks=[checks], jobs=[only_freshness], resources=resources_from_settings(Settings.from_env())).resolve_job_def(
        "freshness_only"
    )
    result = job.execute_in_process(instance=instance)
    (evaluation,) = result.get_asset_check_evaluations()
    return evaluation.passed


@pytest.mark.subprocess
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


def sensor_tick(instance, cursor: str | None):
    """One evaluation of the freshness sensor as the daemon does it: its verdicts recorded as the checks' evaluations."""
    result = freshness_sensor(FRESHNESS)(build_sensor_context(instance=instance, cursor=cursor))
    assert not result.run_requests  # no run, so no task on ECS
    for evaluation in result.asset_events:
        instance.report_runless_asset_event(evaluation)
    return {evaluation.asset_key.to_user_string(): evaluation.passed for evaluation in result.asset_events}, result.cursor


def recorded_states(instance) -> dict[str, str]:
    keys = [AssetCheckKey(bound.asset_key, FRESHNESS_CHECK_NAME) for bound in FRESHNESS]
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(keys)
    return {key.asset_key.to_user_string(): record.status.value for key, record in latest.items()}


def test_the_sensor_records_each_verdict_without_a_run_when_it_changes_and_every_ten_minutes_while_it_holds(monkeypatch):
    books = BOOKS.iceberg.key.to_user_string()
    with instance_for_test() as instance:
        verdicts, cursor = sensor_tick(instance, None)
        assert verdicts and not any(verdicts.values())  # nothing ever materialized: every table red, no sync needed
        assert set(recorded_states(instance).values()) == {"FAILED"} and not instance.get_runs()
        assert sensor_tick(instance, cursor)[0] == {}  # unchanged: nothing recorded again
        materialized(instance, books_iceberg, seconds_ago=10)
        verdicts, cursor = sensor_tick(instance, cursor)
        assert verdicts == {books: True} and recorded_states(instance)[books] == "SUCCEEDED"
        later = time.time() + RECORD_EVERY.total_seconds() + 1
        monkeypatch.setattr(time, "time", lambda: later)  # the bound passed too: red, and the others recorded again
        verdicts, cursor = sensor_tick(instance, cursor)
        assert set(verdicts) == {bound.asset_key.to_user_string() for bound in FRESHNESS} and not any(verdicts.values())
        assert recorded_states(instance)[books] == "FAILED" and not instance.get_runs()


def test_a_cursor_left_by_dagsters_own_freshness_sensor_starts_the_record_anew():
    with instance_for_test() as instance:
        verdicts, _ = sensor_tick(instance, "not json: Dagster's sensor of this name kept its own")
        assert set(verdicts) == {bound.asset_key.to_user_string() for bound in FRESHNESS}
