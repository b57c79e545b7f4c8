"""One books sync cycle (capture, merge, manifest) on the emulator: the edges of its order of events."""

import json
from datetime import UTC, datetime, timedelta
from unittest.mock import Mock

import pytest

from ddb_athena.lib.declarations import declared
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed import cycle as books_cycle
from ddb_athena.streamed.capture.change_files import change_file_name, change_record, write_change_file
from ddb_athena.streamed.capture.commit_manifests import delete_committed_files
from ddb_athena.streamed.capture.stream_reader import latest_stream_arn, list_shards
from ddb_athena.streamed.cycle import StreamSync


def books_sync(spark, settings, **options) -> StreamSync:
    return StreamSync(
        settings.client("dynamodb"),
        settings.client("dynamodbstreams"),
        settings.client("s3"),
        lambda: spark,
        "s3a",
        settings.dynamodb_tables["books"],
        f"{settings.namespace}.books",
        SourceLayout(settings.bucket, "books_source"),
        log=print,
        warn=print,
        spec=declared("books").spec,
        **options,
    )


def put(settings, book_id: str, name: str) -> None:
    settings.client("dynamodb").put_item(TableName=settings.dynamodb_tables["books"], Item={"id": {"S": book_id}, "name": {"S": name}})


def delete(settings, book_id: str) -> None:
    settings.client("dynamodb").delete_item(TableName=settings.dynamodb_tables["books"], Key={"id": {"S": book_id}})


def names(spark, settings) -> dict[str, str]:
    return {row["id"]: row["name"] for row in spark.table(f"{settings.namespace}.books").collect()}


def stream_records(settings) -> list[dict]:
    """Every record the table's stream holds, oldest first (the emulator's single shard)."""
    streams = settings.client("dynamodbstreams")
    arn = latest_stream_arn(settings.client("dynamodb"), settings.dynamodb_tables["books"])
    (shard,) = list_shards(streams, arn)
    iterator = streams.get_shard_iterator(StreamArn=arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    records = []
    while True:
        response = streams.get_records(ShardIterator=iterator, Limit=1000)
        if not response["Records"]:
            return records
        records += response["Records"]
        iterator = response["NextShardIterator"]


def write_lambda_file(settings, records: list[dict], named_at: datetime) -> str:
    return write_change_file(
        settings.client("s3"), SourceLayout(settings.bucket, "books_source"), change_file_name(named_at, "lambda"), [change_record(r) for r in records]
    )


def test_a_cleanup_between_the_manifests_and_the_listing_does_not_fail_the_cycle(spark, settings, monkeypatch):
    put(settings, "a", "first")
    sync = books_sync(spark, settings)
    assert sync.cycle("c1").merged["commit_manifest"]
    put(settings, "b", "second")
    read_manifests = books_cycle.committed_files

    def cleanup_first(s3, layout):
        # The cleanup sensor's run deletes the committed files, then their manifest, at this very moment.
        for manifest in s3.list_objects_v2(Bucket=layout.bucket, Prefix=layout.manifests_prefix).get("Contents", []):
            delete_committed_files(s3, layout.bucket, manifest["Key"])
        return read_manifests(s3, layout)

    monkeypatch.setattr(books_cycle, "committed_files", cleanup_first)
    outcome = sync.cycle("c2")
    assert outcome.merged["files_consumed"] == 1
    assert names(spark, settings) == {"a": "first", "b": "second"}


def test_a_bootstrap_whose_manifest_was_lost_is_listed_by_the_next_cycles_manifest_not_a_cycle_failing_forever(spark, settings, monkeypatch):
    """The bootstrap published, then its manifest's write failed (a lost response, a crash): the next cycle stages the
    snapshot's seal and parts again, which the table has applied already, and its manifest lists them all (the parts
    lie beside the change prefix), so the cleanup deletes them and the cycles go on."""
    put(settings, "a", "first")
    sync = books_sync(spark, settings)
    written = books_cycle.write_commit_manifest

    def lost(*args, **kwargs):
        monkeypatch.setattr(books_cycle, "write_commit_manifest", written)
        raise ConnectionError("the manifest's PUT got no response")

    monkeypatch.setattr(books_cycle, "write_commit_manifest", lost)
    with pytest.raises(ConnectionError):
        sync.cycle("bootstrap", bootstrap=True)
    assert names(spark, settings) == {"a": "first"}
    put(settings, "b", "second")
    outcome = sync.cycle("after")
    s3 = settings.client("s3")
    listed = json.loads(s3.get_object(Bucket=settings.bucket, Key=outcome.merged["commit_manifest"])["Body"].read())["files"]
    assert any("/_snapshots/" in key for key in listed) and any("snapshot" in key and "/changes/" in key for key in listed)
    assert names(spark, settings) == {"a": "first", "b": "second"}
    assert sync.cycle("next").idle  # nothing staged again


def test_a_change_older_than_the_bootstrap_scan_never_beats_it_in_any_file_that_comes_later(spark, settings):
    put(settings, "kept", "v1")
    put(settings, "kept", "v2")
    put(settings, "deleted", "alive")
    delete(settings, "deleted")
    before_scan = stream_records(settings)
    sync = books_sync(spark, settings)
    sync.cycle("bootstrap", bootstrap=True)
    assert names(spark, settings) == {"kept": "v2"}
    # A failed batch replayed after the bootstrap (`replay-failures` names its file at replay time), and the same
    # records in a file of another producer: each is older than the scan, which has seen its effect.
    write_lambda_file(settings, before_scan[:3], datetime.now(UTC) + timedelta(seconds=1))
    sync.cycle("after")
    assert names(spark, settings) == {"kept": "v2"}  # not v1, and "deleted" not back


def test_a_change_after_the_scan_applies_even_in_a_file_named_before_it_by_a_host_whose_clock_is_behind(spark, settings):
    put(settings, "a", "before the scan")
    lambda_sync = books_sync(spark, settings, capture_stream=False)  # the capture Lambda writes the change files
    lambda_sync.cycle("bootstrap", bootstrap=True)
    assert names(spark, settings) == {"a": "before the scan"}
    put(settings, "a", "after the scan")
    newest = stream_records(settings)[-1:]
    write_lambda_file(settings, newest, datetime.now(UTC) - timedelta(minutes=2))
    lambda_sync.cycle("after")
    assert names(spark, settings) == {"a": "after the scan"}


def test_a_snapshot_merged_after_its_bootstrap_failed_is_published_only_once_the_capture_read_through_the_scans_end(spark, settings, monkeypatch):
    """A bootstrap that failed after its seal is finished by a later cycle (the next run's): that cycle's capture reads
    through the stream's end, as the bootstrap's own cycle does, not for one bounded interval; the cycles after the
    snapshot's merge are bounded again."""
    from ddb_athena.streamed.capture.stream_reader import StreamCapture

    put(settings, "a", "first")
    reads = []
    capture = StreamCapture.capture

    def recorded(self, bounded=True):
        reads.append(bounded)
        return capture(self, bounded=bounded)

    monkeypatch.setattr(StreamCapture, "capture", recorded)
    with monkeypatch.context() as patch, pytest.raises(RuntimeError):
        patch.setattr(books_cycle, "merge_change_files", Mock(side_effect=RuntimeError("the run died after the seal")))
        books_sync(spark, settings, capture_seconds=0.5).cycle("bootstrap", bootstrap=True)
    assert reads == [False]
    put(settings, "b", "during")
    following = books_sync(spark, settings, capture_seconds=0.5)  # the next run
    assert following.cycle("finish").merged["files_consumed"] >= 2
    following.cycle("after")
    assert reads == [False, False, True]
    assert names(spark, settings) == {"a": "first", "b": "during"}
