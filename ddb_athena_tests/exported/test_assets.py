"""orders_export and orders_athena through Dagster, against the emulator and local Spark, in the order a new
deployment meets them: point-in-time recovery turned on the same day (the settings fixture does what
`ddb-athena init --yes` does), a bootstrap, the next nights, a backfill from the start date and re-runs."""

import random
from datetime import UTC, date, datetime, timedelta

import pytest
from dagster import AssetMaterialization, AssetSelection, DagsterInstance, materialize
from pyspark.sql import functions as F

from ddb_athena.dev.simulate import order_item
from ddb_athena.exported.export import COVERED, FULL_EXPORT, INCREMENTAL_EXPORT
from ddb_athena.lake.change_merge import table_properties
from ddb_athena.lake.export_load import FULL_EXPORT_TIME_PROPERTY
from ddb_athena_tests.books_and_orders import orders_athena, orders_export, orders_partitions, orders_unique_order_id
from ddb_athena_tests.dagster_helpers import check_results, clock_at, local_resources, materialization_metadata

# The day first, before the emulator's state: see the fixture.
pytestmark = pytest.mark.usefixtures("days")


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as instance:
        yield instance


def sync_orders(instance, partition: str, run_config: dict | None = None, only=None):
    return materialize(
        [orders_export, orders_athena, orders_unique_order_id],
        selection=only,
        partition_key=partition,
        resources=local_resources(export_poll_seconds=0.1),
        instance=instance,
        run_config=run_config,
        raise_on_error=True,
    )


def put_orders(settings, count: int, seed: int) -> None:
    rng = random.Random(seed)
    dynamodb = settings.client("dynamodb")
    for index in range(count):
        dynamodb.put_item(TableName=settings.dynamodb_tables["orders"], Item=order_item(rng, datetime.now(UTC) - timedelta(hours=index)))


def dynamodb_order_ids(settings) -> list[str]:
    pages = settings.client("dynamodb").get_paginator("scan").paginate(TableName=settings.dynamodb_tables["orders"], ProjectionExpression="order_id")
    return [item["order_id"]["S"] for page in pages for item in page["Items"]]


def exports_paid(settings) -> int:
    table_arn = settings.client("dynamodb").describe_table(TableName=settings.dynamodb_tables["orders"])["Table"]["TableArn"]
    return len(settings.client("dynamodb").list_exports(TableArn=table_arn)["ExportSummaries"])


def backfill_from_the_start_date(instance, last: str) -> dict[str, dict]:
    """Every partition from the start date to `last`, one run each, as a backfill runs them; the export metadata of each."""
    keys = [key for key in orders_partitions.get_partition_keys() if key <= last]
    assert keys[0] == orders_partitions.start.date().isoformat()
    exports = {}
    for key in keys:
        result = sync_orders(instance, key)
        assert all(check.passed for check in check_results(result).values()), key
        exports[key] = materialization_metadata(result, "orders_export")
        assert "maintenance_after_data_files" not in materialization_metadata(result, "orders_athena")  # once a day
    return exports


def test_a_new_deployment_bootstraps_and_every_later_night_backfill_and_rerun_succeeds(spark, settings, instance, days):
    pitr = settings.client("dynamodb").describe_continuous_backups(TableName=settings.dynamodb_tables["orders"])["ContinuousBackupsDescription"]
    assert pitr["PointInTimeRecoveryDescription"]["EarliestRestorableDateTime"] > datetime.now(UTC) - timedelta(minutes=5)
    put_orders(settings, 10, seed=1)
    # The first partition run (make dev's, or the first scheduled night's) bootstraps: a full export now.
    bootstrap = sync_orders(instance, days.yesterday)
    export = materialization_metadata(bootstrap, "orders_export")
    assert export["export_type"] == FULL_EXPORT and export["item_count"] == 10 and export["reused_export"] is False
    loaded = materialization_metadata(bootstrap, "orders_athena")
    assert (loaded["rows_inserted"], loaded["duplicates_skipped"], loaded["items_read"]) == (10, 0, 10)
    assert loaded["snapshot_id"] and loaded["bytes_read"] > 0 and loaded["items_per_second"] > 0
    assert all(check.passed for check in check_results(bootstrap).values())
    full_export_time = export["export_time"]
    assert table_properties(spark, f"{settings.namespace}.orders")[FULL_EXPORT_TIME_PROPERTY] == full_export_time

    put_orders(settings, 4, seed=2)
    with clock_at(days.night(1)):  # today's partition holds the full export's time: only the rest of the day
        first_night = sync_orders(instance, days.today.isoformat())
    export = materialization_metadata(first_night, "orders_export")
    assert export["export_type"] == INCREMENTAL_EXPORT
    assert (export["window_start"], export["window_end"]) == (full_export_time, (days.midnight + timedelta(days=1)).isoformat())
    # moto writes the whole table even for an incremental export: the 10 known orders are duplicates.
    loaded = materialization_metadata(first_night, "orders_athena")
    assert (loaded["rows_inserted"], loaded["duplicates_skipped"], loaded["mutated_documents"]) == (4, 10, 0)

    put_orders(settings, 3, seed=3)
    with clock_at(days.night(2)):  # a later day: exactly the day
        second_night = sync_orders(instance, days.tomorrow)
    export = materialization_metadata(second_night, "orders_export")
    assert export["export_type"] == INCREMENTAL_EXPORT
    assert (export["window_start"], export["window_end"]) == ((days.midnight + timedelta(days=1)).isoformat(), (days.midnight + timedelta(days=2)).isoformat())
    loaded = materialization_metadata(second_night, "orders_athena")
    assert loaded["rows_inserted"] == 3
    # A day after the last upkeep of library.orders (compaction, expiry, orphans), the night's load runs it.
    assert loaded["maintenance_before_data_files"] >= 3 and loaded["maintenance_rewritten_data_files"] >= 0
    assert exports_paid(settings) == 3

    with clock_at(days.night(2)):
        backfill = backfill_from_the_start_date(instance, days.tomorrow)
    for key, export in backfill.items():
        if key < days.yesterday:  # ends before the full export: covered by it, nothing exported or loaded
            assert export["export_type"] == COVERED and full_export_time in export["covered_by_export"], key
        else:  # re-runs of what was exported above
            assert export["reused_export"] is True, key
    assert exports_paid(settings) == 3

    rerun = sync_orders(instance, days.yesterday)
    assert materialization_metadata(rerun, "orders_export")["reused_export"] is True
    assert materialization_metadata(rerun, "orders_athena")["rows_inserted"] == 0
    table_ids = [row["order_id"] for row in spark.table(f"{settings.namespace}.orders").select("order_id").collect()]
    assert sorted(table_ids) == sorted(dynamodb_order_ids(settings)) and len(table_ids) == 17
    assert exports_paid(settings) == 3


def test_a_day_the_full_export_covers_loads_nothing_and_says_which_export_covers_it(spark, settings, instance, days):
    put_orders(settings, 3, seed=4)
    bootstrap = materialization_metadata(sync_orders(instance, days.yesterday), "orders_export")
    day_before = (days.today - timedelta(days=2)).isoformat()
    result = sync_orders(instance, day_before)
    export, loaded = materialization_metadata(result, "orders_export"), materialization_metadata(result, "orders_athena")
    assert export["export_type"] == COVERED and export["export_arn"] == bootstrap["export_arn"] and export["item_count"] == 0
    assert export["covered_by_export"] == f"{bootstrap['export_arn']} (every order as of {bootstrap['export_time']})"
    assert loaded["rows_inserted"] == loaded["items_read"] == 0 and loaded["commit_manifest"] is None
    assert loaded["covered_by_export"] == export["covered_by_export"]
    assert all(check.passed for check in check_results(result).values())
    assert exports_paid(settings) == 1


def test_a_changed_order_is_counted_and_warns_without_rewriting_the_row(spark, settings, instance, days):
    put_orders(settings, 3, seed=3)
    sync_orders(instance, days.yesterday)
    (order_id, *_) = dynamodb_order_ids(settings)
    settings.client("dynamodb").update_item(
        TableName=settings.dynamodb_tables["orders"],
        Key={"order_id": {"S": order_id}},
        UpdateExpression="SET paid = :p",
        ExpressionAttributeValues={":p": {"BOOL": False}},
    )
    before = spark.table(f"{settings.namespace}.orders").where(f"order_id = '{order_id}'").collect()[0]["item"]
    with clock_at(days.night(1)):
        result = sync_orders(instance, days.today.isoformat())
    checks = check_results(result)
    assert not checks["orders_no_mutated_documents"].passed
    assert checks["orders_no_mutated_documents"].severity.value == "WARN"
    assert checks["orders_no_mutated_documents"].metadata["sample_keys"].value == order_id
    assert checks["orders_export_reconciles"].passed and checks["orders_unique_order_id"].passed
    assert spark.table(f"{settings.namespace}.orders").where(f"order_id = '{order_id}'").collect()[0]["item"] == before


def unique_order_id_check_after(instance, partition: str, loaded: dict):
    """orders_unique_order_id on its own, after a load of `partition` that reported `loaded`."""
    instance.report_runless_asset_event(AssetMaterialization(orders_athena.key, partition=partition, metadata=loaded))
    result = materialize(
        [orders_athena, orders_unique_order_id], selection=AssetSelection.checks(orders_unique_order_id), resources=local_resources(), instance=instance
    )
    return check_results(result)["orders_unique_order_id"]


def test_the_unique_order_id_check_reads_the_days_a_load_touched_and_the_whole_table_on_sundays(spark, settings, instance, days):
    put_orders(settings, 3, seed=5)
    loaded = materialization_metadata(sync_orders(instance, days.yesterday), "orders_athena")
    orders = f"{settings.namespace}.orders"
    created = sorted(row["created_at"].date().isoformat() for row in spark.table(orders).select("created_at").collect())
    assert (loaded["days_loaded_from"], loaded["days_loaded_to"]) == (created[0], created[-1])
    # A second copy of an order, 30 days before any load: only a pass over the whole table can see it.
    spark.table(orders).limit(1).withColumn("created_at", F.col("created_at") - F.expr("INTERVAL 30 DAYS")).writeTo(orders).append()
    monday = date.fromisoformat(created[0]) - timedelta(days=date.fromisoformat(created[0]).weekday())

    check = unique_order_id_check_after(instance, monday.isoformat(), loaded)
    assert check.passed and check.metadata["scope"].value == f"days {created[0]} to {created[-1]}"
    assert check.metadata["rows"].value == 3
    sunday = monday + timedelta(days=6)
    check = unique_order_id_check_after(instance, sunday.isoformat(), loaded)
    assert not check.passed and check.metadata["scope"].value == "whole table" and check.metadata["duplicate_rows"].value == 1
    # A load whose days hold the copy sees it any day of the week.
    planted = (date.fromisoformat(created[0]) - timedelta(days=30)).isoformat()
    check = unique_order_id_check_after(instance, monday.isoformat(), {**loaded, "days_loaded_from": planted})
    assert not check.passed and check.metadata["duplicate_rows"].value == 1
    # A load that found no documents (a day the full export covers) has nothing to check.
    covered = {key: value for key, value in loaded.items() if not key.startswith("days_loaded")}
    check = unique_order_id_check_after(instance, monday.isoformat(), covered)
    assert check.passed and check.metadata["scope"].value == "no documents loaded"


def test_a_window_lost_to_point_in_time_recovery_fails_before_any_export_and_a_bootstrap_recovers(spark, settings, instance, days):
    put_orders(settings, 2, seed=4)
    sync_orders(instance, days.yesterday)
    # PITR turned off and on again after the full export: it no longer reaches back to the export's time.
    dynamodb = settings.client("dynamodb")
    for enabled in (False, True):
        dynamodb.update_continuous_backups(
            TableName=settings.dynamodb_tables["orders"], PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": enabled}
        )
    with clock_at(days.night(1)):
        with pytest.raises(Exception, match="earliest time point-in-time recovery still holds"):
            sync_orders(instance, days.today.isoformat())
        assert exports_paid(settings) == 1
        recovered = sync_orders(instance, days.today.isoformat(), run_config={"ops": {"orders_export": {"config": {"bootstrap": True}}}})
    assert materialization_metadata(recovered, "orders_export")["export_type"] == FULL_EXPORT
    assert materialization_metadata(recovered, "orders_athena")["duplicates_skipped"] == 2


def test_a_damaged_export_file_turns_the_reconciliation_and_quarantine_checks_red_and_the_rest_loads(spark, settings, instance, days):
    import gzip

    from ddb_athena.exported.export import load_record
    from ddb_athena.lib.source_layout import SourceLayout

    put_orders(settings, 40, seed=5)
    sync_orders(instance, days.yesterday, only=[orders_export])
    s3 = settings.client("s3")
    (data_file,) = load_record(s3, SourceLayout(settings.bucket, "orders_export"), days.yesterday).data_files
    body = s3.get_object(Bucket=settings.bucket, Key=data_file)["Body"].read()
    # Damage the file the way a cut transfer would: recompressed without flushing its last block.
    lines = gzip.decompress(body).splitlines(keepends=True)
    cut = gzip.compress(b"".join(lines))[: -len(gzip.compress(b"".join(lines[-10:])))]
    s3.put_object(Bucket=settings.bucket, Key=data_file, Body=cut)

    result = sync_orders(instance, days.yesterday, only=[orders_athena])
    checks = check_results(result)
    loaded = materialization_metadata(result, "orders_athena")
    assert not checks["orders_export_reconciles"].passed and not checks["orders_quarantine_empty"].passed
    assert checks["orders_export_reconciles"].metadata["unaccounted"].value == 40 - loaded["items_read"] > 0
    assert loaded["corrupt_files"] == 1 and loaded["rows_inserted"] == loaded["items_read"] > 0
    assert spark.table(f"{settings.namespace}.orders").count() == loaded["rows_inserted"]


SHIPMENTS = """
[shipments]
kind = "exported"
dynamodb_table = "shipments"
iceberg_table = "shipments"
partition_key = { attribute = "order_id", type = "S" }
sort_key = { attribute = "parcel", type = "N" }
columns = [
    { name = "shipped_at", attribute = "shipped_at", transform = "iso_timestamp", required = true },
    { name = "carrier", attribute = "carrier" },
]
partition_by = ["days(shipped_at)"]
freshness_minutes = 1560
"""


def test_any_exported_table_declared_gets_its_own_assets_and_checks_and_loads_its_composite_keys(spark, settings, instance, days, monkeypatch):
    """A second exported table, declared with a composite key (S + N): the factory gives it orders' assets and checks
    under its own names, and its export lands in its own Iceberg table, each (order_id, parcel) once, read back by
    PyIceberg as Athena reads it. Delimiter characters in a key part never merge two keys."""
    from pathlib import Path
    from urllib.parse import urlparse

    from pyiceberg.table import StaticTable

    from ddb_athena.exported.assets import exported_assets
    from ddb_athena.exported.checks import exported_checks
    from ddb_athena.lib import declarations

    table = declarations.parse_declarations(SHIPMENTS)["shipments"]
    # As if ddb_athena/tables.toml declared it: the load (in the run, or a job on EMR) finds its declaration by name.
    with_shipments = {**declarations.declared_tables(), "shipments": table}
    monkeypatch.setattr(declarations, "declared_tables", lambda: with_shipments)
    assets = exported_assets(table, days.yesterday)
    checks = exported_checks(assets)
    dynamodb = settings.client("dynamodb")
    dynamodb.create_table(
        TableName="shipments",
        KeySchema=[{"AttributeName": "order_id", "KeyType": "HASH"}, {"AttributeName": "parcel", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": "order_id", "AttributeType": "S"}, {"AttributeName": "parcel", "AttributeType": "N"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.update_continuous_backups(TableName="shipments", PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True})
    shipped = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    # Joined by "#", ("a#b", 1) would read as order "a" with a parcel "b#1": each key part stays its own column.
    keys = [("a#b", "1"), ("a", "1"), ("a", "2"), ("a#b#", "1"), ("x", "10")]
    for order_id, parcel in keys:
        item = {"order_id": {"S": order_id}, "parcel": {"N": parcel}, "shipped_at": {"S": shipped}, "carrier": {"S": "post"}}
        dynamodb.put_item(TableName="shipments", Item=item)
    result = materialize(
        [assets.export, assets.athena, *checks.all],
        partition_key=days.yesterday,
        resources=local_resources(export_poll_seconds=0.1),
        instance=instance,
        raise_on_error=True,
    )
    loaded = materialization_metadata(result, "shipments_athena")
    assert loaded["rows_inserted"] == len(keys) and loaded["duplicates_skipped"] == 0
    assert materialization_metadata(result, "shipments_export")["item_count"] == len(keys)
    results = check_results(result)
    assert {"shipments_export_reconciles", "shipments_no_mutated_documents", "shipments_quarantine_empty", "shipments_unique_order_id_parcel"} <= set(results)
    assert all(check.passed for check in results.values()), {name: check.metadata for name, check in results.items()}
    location = Path(urlparse(settings.warehouse).path) / settings.namespace / "shipments"
    rows = StaticTable.from_metadata(str(location)).scan(selected_fields=("order_id", "parcel", "carrier")).to_arrow().to_pylist()
    assert sorted((row["order_id"], str(row["parcel"]), row["carrier"]) for row in rows) == sorted((o, p, "post") for o, p in keys)
    # The next night's run for the same day finds every key loaded: nothing twice.
    again = materialize([assets.export, assets.athena], partition_key=days.yesterday, resources=local_resources(export_poll_seconds=0.1), instance=instance)
    assert materialization_metadata(again, "shipments_athena")["rows_inserted"] == 0
    assert len(StaticTable.from_metadata(str(location)).scan().to_arrow()) == len(keys)
