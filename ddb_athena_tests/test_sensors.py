"""The cleanup sensor: one run per committing materialization, never twice, deleting exactly its files."""

import pytest
from dagster import build_sensor_context, instance_for_test

from ddb_athena.capture.change_files import SourceLayout, list_change_files
from ddb_athena.jobs import source_cleanup
from ddb_athena.sensors import cleanup_after_materialization
from ddb_athena.simulate import BookSimulator
from ddb_athena_tests.dagster_helpers import local_resources, materialization_metadata, sync_books
from ddb_athena_tests.spark.helpers import ChangeFiles, change


@pytest.fixture
def instance():
    with instance_for_test() as instance:
        yield instance


def evaluate(instance, cursor=None):
    resources = local_resources()
    context = build_sensor_context(instance=instance, cursor=cursor, resources={"sync": resources["sync"]})
    result = cleanup_after_materialization.evaluate_tick(context)
    return result.run_requests or [], result.cursor


def test_each_materialization_gets_one_cleanup_that_deletes_only_what_it_committed(spark, settings, instance):
    simulator = BookSimulator(settings.client("dynamodb"), settings.books_table)
    simulator.insert()
    first = materialization_metadata(sync_books(instance), "books_iceberg")
    simulator.insert()
    second = materialization_metadata(sync_books(instance), "books_iceberg")
    # A file that lands after the last merge: not committed, so no cleanup may touch it.
    late = ChangeFiles(spark, settings).write(change(10**30, "late", "INSERT"))

    requests, cursor = evaluate(instance)
    assert [r.run_config["ops"]["delete_committed_source_files"]["config"]["manifest_key"] for r in requests] == [
        first["commit_manifest"],
        second["commit_manifest"],
    ]
    assert len({r.run_key for r in requests}) == 2
    assert evaluate(instance, cursor)[0] == []  # evaluated again: nothing new, nothing twice

    for request in requests:
        assert source_cleanup.execute_in_process(run_config=request.run_config, resources=local_resources()).success
    assert list_change_files(settings.client("s3"), SourceLayout(settings.bucket, "books_source")) == [late]
