"""orders_export and orders_athena through Dagster, against the emulator and local Spark: two daily
partitions and a re-run leave every order of DynamoDB in library.orders exactly once."""

import random
from datetime import datetime, timedelta, timezone

import pytest
from dagster import DagsterInstance, materialize

from ddb_athena.assets.orders import orders_athena, orders_export
from ddb_athena.checks.orders import orders_unique_order_id
from ddb_athena.simulate import order_item
from ddb_athena_tests.dagster_helpers import check_results, local_resources, materialization_metadata
from ddb_athena_tests.exports.helpers import pitr_holds_since

TODAY = datetime.now(timezone.utc).date()
FIRST_DAY, SECOND_DAY = (TODAY - timedelta(days=3)).isoformat(), (TODAY - timedelta(days=2)).isoformat()


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
        dynamodb.put_item(TableName=settings.orders_table, Item=order_item(rng, datetime.now(timezone.utc) - timedelta(hours=index)))


def dynamodb_order_ids(settings) -> list[str]:
    pages = settings.client("dynamodb").get_paginator("scan").paginate(TableName=settings.orders_table, ProjectionExpression="order_id")
    return [item["order_id"]["S"] for page in pages for item in page["Items"]]


def test_two_daily_partitions_and_a_rerun_load_every_order_exactly_once(spark, settings, instance):
    pitr_holds_since(settings, datetime.now(timezone.utc) - timedelta(days=30))
    put_orders(settings, 20, seed=1)
    first = sync_orders(instance, FIRST_DAY)
    export = materialization_metadata(first, "orders_export")
    assert export["export_type"] == "FULL_EXPORT" and export["item_count"] == 20 and export["reused_export"] is False
    loaded = materialization_metadata(first, "orders_athena")
    assert (loaded["rows_inserted"], loaded["duplicates_skipped"], loaded["items_read"]) == (20, 0, 20)
    assert loaded["snapshot_id"] and loaded["bytes_read"] > 0 and loaded["items_per_second"] > 0
    assert all(check.passed for check in check_results(first).values())

    put_orders(settings, 5, seed=2)
    second = sync_orders(instance, SECOND_DAY)
    export = materialization_metadata(second, "orders_export")
    assert export["export_type"] == "INCREMENTAL_EXPORT"
    assert export["window_start"].startswith(SECOND_DAY) and export["window_end"].startswith((TODAY - timedelta(days=1)).isoformat())
    # moto writes a full snapshot even for an incremental export: the 20 known orders are duplicates.
    loaded = materialization_metadata(second, "orders_athena")
    assert (loaded["rows_inserted"], loaded["duplicates_skipped"], loaded["mutated_documents"]) == (5, 20, 0)

    rerun = sync_orders(instance, SECOND_DAY)
    assert materialization_metadata(rerun, "orders_export")["reused_export"] is True
    assert materialization_metadata(rerun, "orders_athena")["rows_inserted"] == 0
    assert all(check.passed for check in check_results(rerun).values())

    table_ids = [row["order_id"] for row in spark.table(f"{settings.namespace}.orders").select("order_id").collect()]
    assert sorted(table_ids) == sorted(dynamodb_order_ids(settings)) and len(table_ids) == 25
    table_arn = settings.client("dynamodb").describe_table(TableName=settings.orders_table)["Table"]["TableArn"]
    assert len(settings.client("dynamodb").list_exports(TableArn=table_arn)["ExportSummaries"]) == 2  # the re-run paid nothing


def test_a_changed_order_is_counted_and_warns_without_rewriting_the_row(spark, settings, instance):
    pitr_holds_since(settings, datetime.now(timezone.utc) - timedelta(days=30))
    put_orders(settings, 3, seed=3)
    sync_orders(instance, FIRST_DAY)
    (order_id, *_) = dynamodb_order_ids(settings)
    settings.client("dynamodb").update_item(
        TableName=settings.orders_table, Key={"order_id": {"S": order_id}}, UpdateExpression="SET paid = :p", ExpressionAttributeValues={":p": {"BOOL": False}}
    )
    before = spark.table(f"{settings.namespace}.orders").where(f"order_id = '{order_id}'").collect()[0]["item"]
    result = sync_orders(instance, SECOND_DAY)
    checks = check_results(result)
    assert not checks["orders_no_mutated_documents"].passed
    assert checks["orders_no_mutated_documents"].severity.value == "WARN"
    assert checks["orders_no_mutated_documents"].metadata["sample_keys"].value == order_id
    assert checks["orders_export_reconciles"].passed and checks["orders_unique_order_id"].passed
    assert spark.table(f"{settings.namespace}.orders").where(f"order_id = '{order_id}'").collect()[0]["item"] == before


def test_an_expired_window_fails_before_any_export_and_a_bootstrap_recovers(spark, settings, instance):
    put_orders(settings, 2, seed=4)
    sync_orders(instance, FIRST_DAY)
    # PITR holds only from when it was turned on (moto: the test's start), so the day's window is gone.
    with pytest.raises(Exception, match="earliest time point-in-time recovery still holds"):
        sync_orders(instance, SECOND_DAY)
    recovered = sync_orders(instance, SECOND_DAY, run_config={"ops": {"orders_export": {"config": {"bootstrap": True}}}})
    assert materialization_metadata(recovered, "orders_export")["export_type"] == "FULL_EXPORT"
    assert materialization_metadata(recovered, "orders_athena")["duplicates_skipped"] == 2


def test_a_damaged_export_file_turns_the_reconciliation_and_quarantine_checks_red_and_the_rest_loads(spark, settings, instance):
    import gzip

    from ddb_athena.capture.change_files import SourceLayout
    from ddb_athena.exports.table_export import load_record

    put_orders(settings, 40, seed=5)
    sync_orders(instance, FIRST_DAY, only=[orders_export])
    s3 = settings.client("s3")
    (data_file,) = load_record(s3, SourceLayout(settings.bucket, "orders_export"), FIRST_DAY).data_files
    body = s3.get_object(Bucket=settings.bucket, Key=data_file)["Body"].read()
    # Damage the file the way a cut transfer would: recompressed without flushing its last block.
    lines = gzip.decompress(body).splitlines(keepends=True)
    cut = gzip.compress(b"".join(lines))[: -len(gzip.compress(b"".join(lines[-10:])))]
    s3.put_object(Bucket=settings.bucket, Key=data_file, Body=cut)

    result = sync_orders(instance, FIRST_DAY, only=[orders_athena])
    checks = check_results(result)
    loaded = materialization_metadata(result, "orders_athena")
    assert not checks["orders_export_reconciles"].passed and not checks["orders_quarantine_empty"].passed
    assert checks["orders_export_reconciles"].metadata["unaccounted"].value == 40 - loaded["items_read"] > 0
    assert loaded["corrupt_files"] == 1 and loaded["rows_inserted"] == loaded["items_read"] > 0
    assert spark.table(f"{settings.namespace}.orders").count() == loaded["rows_inserted"]
