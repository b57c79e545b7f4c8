"""books_source and books_iceberg materialized through Dagster, against the emulator and local Spark."""

from dataclasses import replace

import pytest
from dagster import DagsterInstance

from ddb_athena.capture.change_files import SourceLayout
from ddb_athena.capture.checkpoints import CheckpointStore
from ddb_athena.checks.books import dynamodb_item_count
from ddb_athena.simulate import BookSimulator
from ddb_athena_tests.dagster_helpers import materialization_metadata, sync_books


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as instance:
        yield instance


def test_first_sync_bootstraps_then_minute_syncs_apply_changes(spark, settings, instance):
    dynamodb = settings.client("dynamodb")
    simulator = BookSimulator(dynamodb, settings.books_table)
    for _ in range(12):
        simulator.insert()

    first = sync_books(instance)
    source = materialization_metadata(first, "books_source")
    assert source["bootstrap_items"] == 12 and source["records_captured"] == 12  # the scan, and the stream replayed after it
    merged = materialization_metadata(first, "books_iceberg")
    assert merged["rows_inserted"] == 12 and merged["files_consumed"] == 2 and merged["bootstrap_file"]
    assert merged["snapshot_id"] and merged["commit_manifest"].startswith("books_source/_manifests/")
    for number in ("lag_seconds", "duration_seconds", "rows_updated", "rows_deleted", "records_consumed"):
        assert isinstance(merged[number], (int, float))  # numbers, so the UI plots them

    for _ in range(30):
        simulator.step()
    second = sync_books(instance)
    assert materialization_metadata(second, "books_source")["bootstrap_items"] == 0
    merged = materialization_metadata(second, "books_iceberg")
    assert merged["bootstrap_file"] is None and merged["rows_inserted"] + merged["rows_updated"] + merged["rows_deleted"] > 0
    iceberg_rows = spark.table(f"{settings.namespace}.books").count()
    assert iceberg_rows == dynamodb_item_count(dynamodb, settings.books_table)


def test_a_requested_bootstrap_recovers_from_a_stream_gap(spark, settings, instance):
    dynamodb = settings.client("dynamodb")
    simulator = BookSimulator(dynamodb, settings.books_table)
    simulator.insert()
    sync_books(instance)
    # Positions that no longer match the stream (as after a 24-hour trim or a re-created stream).
    store = CheckpointStore(settings.client("s3"), SourceLayout(settings.bucket, "books_source"))
    checkpoints = store.load_all()
    store.delete_all()
    for checkpoint in checkpoints:
        store.save(replace(checkpoint, stream_arn=checkpoint.stream_arn + "-before-recreation"))
    simulator.insert()
    with pytest.raises(Exception, match="bootstrap"):
        sync_books(instance)
    recovered = sync_books(instance, config={"bootstrap": True})
    assert materialization_metadata(recovered, "books_source")["bootstrap_items"] == 2
    assert spark.table(f"{settings.namespace}.books").count() == 2
