"""AWS Lambda entry point for event-driven capture from a DynamoDB stream.

Configure the function with a DynamoDB stream event source mapping and the environment
variable DDB_ATHENA_BUCKET (and DDB_ATHENA_SOURCE_PREFIX, default `books_source`). Lambda keeps the
stream position itself; a failure raises, so Lambda retries the same batch, and the merge is
idempotent over the duplicate file a retry may leave.
"""

import os

from ddb_athena.capture.change_files import ChangeFileNamer, SourceLayout, change_record, write_change_file
from ddb_athena.settings import BOOKS_SOURCE_PREFIX

_namer = ChangeFileNamer()


def handle_stream_event(event: dict, s3, layout: SourceLayout, namer: ChangeFileNamer = _namer) -> dict:
    # Lambda events do not name the shard; ordering needs only the sequence numbers.
    records = [change_record(record) for record in event.get("Records", [])]
    if not records:
        return {"batchItemFailures": [], "changeFile": None}
    key = write_change_file(s3, layout, namer.next_name("lambda"), records)
    return {"batchItemFailures": [], "changeFile": key}


def handler(event: dict, context) -> dict:
    import boto3

    layout = SourceLayout(os.environ["DDB_ATHENA_BUCKET"], os.environ.get("DDB_ATHENA_SOURCE_PREFIX", BOOKS_SOURCE_PREFIX))
    return handle_stream_event(event, boto3.client("s3"), layout)
