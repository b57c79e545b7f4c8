import json

import pytest

from ddb_athena.lib.declarations import UndeclaredStreamError
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import list_change_files
from ddb_athena.streamed.capture.lambda_handler import handle_stream_event, handler, source_prefix

# The shape AWS documents for a DynamoDB Streams event delivered to Lambda (epoch-second
# timestamps, base64 binary), with INSERT, MODIFY and REMOVE records.
SOURCE_ARN = "arn:aws:dynamodb:us-east-1:123456789012:table/books/stream/2026-11-22T00:00:00.000"
EVENT = {
    "Records": [
        {
            "eventID": "c4ca4238a0b923820dcc509a6f75849b",
            "eventName": "INSERT",
            "eventVersion": "1.1",
            "eventSource": "aws:dynamodb",
            "awsRegion": "us-east-1",
            "dynamodb": {
                "ApproximateCreationDateTime": 1763780400,
                "Keys": {"id": {"S": "101"}},
                "NewImage": {"id": {"S": "101"}, "name": {"S": "New item!"}, "date": {"N": "1763780400000000001"}, "cover": {"B": "AAH/"}},
                "SequenceNumber": "111",
                "SizeBytes": 26,
                "StreamViewType": "NEW_AND_OLD_IMAGES",
            },
            "eventSourceARN": SOURCE_ARN,
        },
        {
            "eventID": "c81e728d9d4c2f636f067f89cc14862c",
            "eventName": "MODIFY",
            "eventVersion": "1.1",
            "eventSource": "aws:dynamodb",
            "awsRegion": "us-east-1",
            "dynamodb": {
                "ApproximateCreationDateTime": 1763780401.5,
                "Keys": {"id": {"S": "101"}},
                "NewImage": {"id": {"S": "101"}, "name": {"S": "This item has changed"}, "tags": {"SS": ["a", "b"]}},
                "OldImage": {"id": {"S": "101"}, "name": {"S": "New item!"}},
                "SequenceNumber": "222",
                "SizeBytes": 59,
                "StreamViewType": "NEW_AND_OLD_IMAGES",
            },
            "eventSourceARN": SOURCE_ARN,
        },
        {
            "eventID": "eccbc87e4b5ce2fe28308fd9f2a7baf3",
            "eventName": "REMOVE",
            "eventVersion": "1.1",
            "eventSource": "aws:dynamodb",
            "awsRegion": "us-east-1",
            "dynamodb": {
                "ApproximateCreationDateTime": 1763780402,
                "Keys": {"id": {"S": "101"}},
                "OldImage": {"id": {"S": "101"}, "name": {"S": "This item has changed"}},
                "SequenceNumber": "333",
                "SizeBytes": 38,
                "StreamViewType": "NEW_AND_OLD_IMAGES",
            },
            "eventSourceARN": SOURCE_ARN,
        },
    ]
}


def test_a_stream_event_becomes_one_change_file(settings, monkeypatch):
    monkeypatch.setenv("DDB_ATHENA_BUCKET", settings.bucket)
    response = handler(EVENT, context=None)
    assert response["batchItemFailures"] == []
    s3 = settings.client("s3")
    layout = SourceLayout(settings.bucket, "books_source")
    assert list_change_files(s3, layout) == [response["changeFile"]]
    lines = s3.get_object(Bucket=settings.bucket, Key=response["changeFile"])["Body"].read().decode().splitlines()
    records = [json.loads(line) for line in lines]
    assert [(r["event_name"], r["sequence_number"]) for r in records] == [("INSERT", "111"), ("MODIFY", "222"), ("REMOVE", "333")]
    assert records[0]["new_image"]["cover"] == {"B": "AAH/"}
    assert records[0]["approximate_creation_time"] == "2025-11-22T03:00:00.000000Z"
    assert records[1]["approximate_creation_time"] == "2025-11-22T03:00:01.500000Z"
    assert records[2]["new_image"] is None and records[2]["keys"] == {"id": {"S": "101"}}


def test_an_empty_batch_writes_nothing(settings):
    layout = SourceLayout(settings.bucket, "books_source")
    assert handle_stream_event({"Records": []}, settings.client("s3"), layout)["changeFile"] is None
    assert list_change_files(settings.client("s3"), layout) == []


def test_a_failed_write_reports_the_whole_batch_for_retry(settings):
    layout = SourceLayout("no-such-bucket", "books_source")
    response = handle_stream_event(EVENT, settings.client("s3"), layout)
    assert response == {"batchItemFailures": [{"itemIdentifier": "111"}], "changeFile": None}


def unreadable(sequence_number: str) -> dict:
    """A stream record without its Keys."""
    record = json.loads(json.dumps(EVENT["Records"][1]))
    del record["dynamodb"]["Keys"]
    record["dynamodb"]["SequenceNumber"] = sequence_number
    return record


def test_an_unreadable_record_is_retried_from_and_the_records_before_it_are_kept(settings):
    layout = SourceLayout(settings.bucket, "books_source")
    first, _, last = EVENT["Records"]
    response = handle_stream_event({"Records": [first, unreadable("150"), last]}, settings.client("s3"), layout)
    assert response["batchItemFailures"] == [{"itemIdentifier": "150"}]
    body = settings.client("s3").get_object(Bucket=settings.bucket, Key=response["changeFile"])["Body"].read().decode()
    assert [json.loads(line)["sequence_number"] for line in body.splitlines()] == ["111"]
    # Lambda retries from 150: while it stays unreadable, nothing is written and the failure is reported again.
    assert handle_stream_event({"Records": [unreadable("150"), last]}, settings.client("s3"), layout) == {
        "batchItemFailures": [{"itemIdentifier": "150"}],
        "changeFile": None,
    }


def test_the_stream_names_the_declared_table_whose_prefix_gets_the_files():
    assert source_prefix(EVENT, {}) == "books_source"
    assert source_prefix({"Records": []}, {}) is None
    # A deployment's own table name reaches the function as the declaration's variable.
    renamed = {"Records": [{**record, "eventSourceARN": SOURCE_ARN.replace("table/books/", "table/prod-books/")} for record in EVENT["Records"]]}
    assert source_prefix(renamed, {"DDB_ATHENA_BOOKS_TABLE": "prod-books"}) == "books_source"
    with pytest.raises(UndeclaredStreamError, match="'prod-books'"):
        source_prefix(renamed, {})
    # orders is declared, but not streamed.
    exported = {"Records": [{**EVENT["Records"][0], "eventSourceARN": SOURCE_ARN.replace("table/books/", "table/orders/")}]}
    with pytest.raises(UndeclaredStreamError):
        source_prefix(exported, {})


def test_a_stream_of_no_declared_table_fails_the_batch_and_writes_nothing(settings, monkeypatch):
    monkeypatch.setenv("DDB_ATHENA_BUCKET", settings.bucket)
    stranger = {"Records": [{**EVENT["Records"][0], "eventSourceARN": SOURCE_ARN.replace("table/books/", "table/strangers/")}]}
    with pytest.raises(UndeclaredStreamError):
        handler(stranger, context=None)
    assert settings.client("s3").list_objects_v2(Bucket=settings.bucket).get("KeyCount", 0) == 0
