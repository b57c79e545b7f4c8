import json
from datetime import UTC, datetime, timedelta

import pytest
from botocore.exceptions import ClientError

from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import (
    ChangeFileNamer,
    change_file_name,
    change_record,
    list_change_files,
    parse_change_file_name,
    snapshot_record,
    write_change_file,
)
from ddb_athena_tests.streamed.capture.fakes import stream_record


def test_names_sort_in_capture_order_even_within_one_microsecond():
    frozen = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
    namer = ChangeFileNamer(clock=lambda: frozen)
    names = [namer.next_name("stream") for _ in range(5)]
    assert names == sorted(names) and len(set(names)) == 5
    assert parse_change_file_name(names[0]) == (frozen, "stream")
    assert parse_change_file_name("books_source/changes/" + names[4])[0] == frozen + timedelta(microseconds=4)


def test_names_order_across_days_and_years():
    times = [datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)]
    assert change_file_name(times[0], "stream") < change_file_name(times[1], "lambda")


@pytest.mark.parametrize("name", ["x.jsonl", "20261122T030000.000000Z-Stream-ab.jsonl", "20261122T030000Z-stream-ab.jsonl"])
def test_foreign_names_are_rejected(name):
    with pytest.raises(ValueError):
        parse_change_file_name(name)


def test_records_from_boto3_and_from_lambda_are_the_same():
    from_boto3 = change_record(stream_record(42, "b1"), "shard-1")
    lambda_shape = stream_record(42, "b1")
    lambda_shape["dynamodb"]["ApproximateCreationDateTime"] = datetime(2026, 11, 22, tzinfo=UTC).timestamp()
    lambda_shape["dynamodb"]["NewImage"]["cover"] = {"B": "AAE="}
    from_lambda = change_record(lambda_shape, "shard-1")
    assert from_boto3 == from_lambda
    assert json.loads(from_boto3.to_json()) == {
        "event_name": "MODIFY",
        "keys": {"id": {"S": "b1"}},
        "new_image": {"id": {"S": "b1"}, "name": {"S": "n"}, "cover": {"B": "AAE="}},
        "sequence_number": "42",
        "approximate_creation_time": "2026-11-22T00:00:00.000000Z",
        "shard_id": "shard-1",
    }
    assert change_record(stream_record(43, "b1", "REMOVE")).new_image is None


def test_snapshot_records_rank_below_every_stream_change():
    record = snapshot_record({"id": {"S": "b1"}, "x": {"N": "1"}}, ("id",), datetime(2026, 11, 22, tzinfo=UTC))
    assert record.event_name == "SNAPSHOT" and record.sequence_number == "0" and record.keys == {"id": {"S": "b1"}}


def test_change_files_are_written_once_and_listed_in_order(settings):
    s3 = settings.client("s3")
    layout = SourceLayout(settings.bucket, "books_source")
    later = write_change_file(s3, layout, change_file_name(datetime(2026, 11, 22, 3, 1, tzinfo=UTC), "stream"), [])
    earlier_name = change_file_name(datetime(2026, 11, 22, 3, 0, tzinfo=UTC), "lambda")
    earlier = write_change_file(s3, layout, earlier_name, [change_record(stream_record(1, "b1"))])
    s3.put_object(Bucket=settings.bucket, Key=layout.changes_prefix + "README.txt", Body=b"not a change file")
    assert list_change_files(s3, layout) == [earlier, later]
    with pytest.raises(ClientError) as error:  # never overwrites a file that exists
        write_change_file(s3, layout, earlier_name, [])
    assert error.value.response["Error"]["Code"] in ("PreconditionFailed", "412")
