"""The cleanup sensor: one run per committing materialization, never twice, deleting exactly its files."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from dagster import build_sensor_context, instance_for_test

from ddb_athena.cleanup import sensors
from ddb_athena.cleanup.sensors import cleanup_after_materialization, unclaimed_manifests
from ddb_athena.dev.simulate import BookSimulator
from ddb_athena.lib.run_capacity import RUN_TASK_KWARGS_TAG, capacity_tags
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import list_change_files
from ddb_athena.streamed.capture.commit_manifests import write_commit_manifest
from ddb_athena.streamed.capture.lambda_handler import handle_stream_event
from ddb_athena_tests.books_and_orders import books_source_cleanup, orders_export_cleanup
from ddb_athena_tests.dagster_helpers import local_resources, materialization_metadata, sync_books
from ddb_athena_tests.lake.helpers import ChangeFiles, change
from ddb_athena_tests.streamed.test_assets import lambda_event
from ddb_athena_tests.streamed.test_cycle import stream_records


@pytest.fixture
def instance():
    with instance_for_test() as instance:
        yield instance


CLEANUP_ROLE = "arn:aws:iam::123456789012:role/ddb-athena-DagsterCleanupRole"


def evaluate(instance, cursor=None, **sync_options):
    resources = local_resources(**sync_options)
    context = build_sensor_context(instance=instance, cursor=cursor, resources={"sync": resources["sync"], "aws": resources["aws"]})
    result = cleanup_after_materialization.evaluate_tick(context)
    return result.run_requests or [], result.cursor


def test_each_materialization_gets_one_cleanup_that_deletes_only_what_it_committed(spark, settings, instance):
    """The files in S3: a bootstrap's snapshot, and the capture Lambda's change files (the run's own capture keeps its
    files on local disk: a commit of those alone has no manifest, nothing to clean up)."""
    s3, layout = settings.client("s3"), SourceLayout(settings.bucket, "books_source")
    BookSimulator(settings.client("dynamodb"), settings.dynamodb_tables["books"]).insert("scanned")
    newest = int(stream_records(settings)[-1]["dynamodb"]["SequenceNumber"])
    first = materialization_metadata(sync_books(instance, books_capture="lambda"), "books_iceberg")
    handle_stream_event(lambda_event("after-scan", str(newest + 200), "captured by the Lambda"), s3, layout)
    second = materialization_metadata(sync_books(instance, books_capture="lambda"), "books_iceberg")
    # A file that lands after the last merge: not committed, so no cleanup may touch it.
    late = ChangeFiles(spark, settings).write(change(10**30, "late", "INSERT"))

    # One run for everything committed since the last tick (a run per 10-second cycle would cost more than the merges).
    (request,), cursor = evaluate(instance, cleanup_role_arn=CLEANUP_ROLE)
    assert request.job_name == "books_source_cleanup"
    assert request.run_config["ops"]["delete_committed_change_files"]["config"]["manifest_keys"] == [
        first["commit_manifest"],
        second["commit_manifest"],
    ]
    assert request.tags["ddb_athena/cleanup"] == "books_iceberg"
    # On ECS in the deployment's capacity (Spot by default), as the sync's runs are.
    assert request.tags[RUN_TASK_KWARGS_TAG] == capacity_tags("FARGATE_SPOT")[RUN_TASK_KWARGS_TAG]
    # The cleanups' own role is the launcher's to give (lib/ecs_launcher.py, by the job), never a run tag's.
    assert "ecs/task_overrides" not in request.tags
    assert evaluate(instance, cursor)[0] == []  # evaluated again: nothing new, nothing twice

    assert books_source_cleanup.execute_in_process(run_config=request.run_config, resources=local_resources()).success
    assert list_change_files(settings.client("s3"), SourceLayout(settings.bucket, "books_source")) == [late]


@pytest.mark.usefixtures("days")  # the day first, before the emulator's state: see the fixture
def test_an_orders_load_gets_one_cleanup_of_exactly_its_export_and_the_retention_delays_it(days, spark, settings, instance):
    from ddb_athena.streamed.capture.change_files import list_keys
    from ddb_athena_tests.exported.test_assets import put_orders, sync_orders

    put_orders(settings, 3, seed=9)
    sync_orders(instance, days.yesterday)
    s3 = settings.client("s3")
    exported = [obj["Key"] for obj in list_keys(s3, settings.bucket, f"orders_export/{days.yesterday}/attempt-1/")]
    assert exported

    resources = local_resources(export_retention_days=1)
    held = cleanup_after_materialization.evaluate_tick(build_sensor_context(instance=instance, resources={"sync": resources["sync"], "aws": resources["aws"]}))
    assert not held.run_requests  # kept for a day, for audit

    requests, cursor = evaluate(instance)
    (request,) = requests
    # In the orders writers' pool: a re-run of the partition re-uses these files and must not lose them mid-load.
    assert request.job_name == "orders_export_cleanup" and request.tags["ddb_athena/cleanup"] == "orders_athena"
    assert evaluate(instance, cursor)[0] == []
    assert orders_export_cleanup.execute_in_process(run_config=request.run_config, resources=local_resources(), tags=request.tags).success
    assert [obj["Key"] for obj in list_keys(s3, settings.bucket, f"orders_export/{days.yesterday}/")] == [f"orders_export/{days.yesterday}/_export.json"]
    assert spark.table(f"{settings.namespace}.orders").count() == 3  # the table does not reference export files


def test_a_cursor_of_the_books_only_sensor_is_carried_over(settings, instance):
    requests, cursor = evaluate(instance, cursor="12345")
    assert requests == [] and json.loads(cursor) == {"books_iceberg": 12345}


def test_a_manifest_no_materialization_named_is_cleaned_up_an_hour_later(spark, settings, instance, monkeypatch):
    """A run killed between its commit manifest and its materialization: the manifest's files (committed, and skipped
    by every later merge) are cleaned up once the manifest is an hour old, not kept for ever."""
    s3, layout = settings.client("s3"), SourceLayout(settings.bucket, "books_source")
    files = ChangeFiles(spark, settings)
    consumed = [files.write(change(1, "a", "INSERT")), files.write(change(2, "b", "INSERT"))]
    files.merge(consumed)
    manifest = write_commit_manifest(s3, layout, "the-killed-run", consumed, files.table, None)
    late = files.write(change(3, "c", "INSERT"))  # not committed: no cleanup may touch it

    assert evaluate(instance)[0] == []  # young: its materialization may still come
    assert unclaimed_manifests(s3, layout, timedelta(0), datetime.now(UTC) + timedelta(hours=1, minutes=1)) == [manifest]
    monkeypatch.setattr(sensors, "UNCLAIMED_MANIFEST_AGE", timedelta(minutes=-1))  # as if an hour went by
    (request,), cursor = evaluate(instance)
    assert request.job_name == "books_source_cleanup" and request.run_key.startswith("cleanup-books_iceberg-unclaimed-")
    assert request.run_config["ops"]["delete_committed_change_files"]["config"]["manifest_keys"] == [manifest]
    assert books_source_cleanup.execute_in_process(run_config=request.run_config, resources=local_resources()).success
    assert list_change_files(s3, layout) == [late]
    assert evaluate(instance, cursor)[0] == []  # cleaned up: nothing left unclaimed
