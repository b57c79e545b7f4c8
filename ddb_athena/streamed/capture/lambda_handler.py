"""AWS Lambda entry point for event-driven capture from a DynamoDB stream.

Configure the function with a DynamoDB stream event source mapping (`FunctionResponseTypes:
[ReportBatchItemFailures]`, deploy/ddb_athena.yaml) and the environment variable DDB_ATHENA_BUCKET. The table comes
from the stream's ARN: the streamed table declared with that DynamoDB table (ddb_athena/tables.toml, its name or the
variable that names it, set on the function too) gets the change files, under its source prefix; a stream of no
declared table fails the batch. Each batch becomes one change file. A record that cannot
be read is reported as the batch's first failure: the records before it are written, and Lambda retries
from it until its retries or record age run out, then hands the range to the on-failure destination, so a
bad record never blocks its shard. A failed write reports the whole batch. The merge is idempotent over
the duplicate file a retry may leave.

Imports stay within the standard library, botocore and this package's capture modules: the deployment zip
(`make lambda`) carries exactly these files and the declarations, and the Lambda Python runtime provides boto3 and
botocore.
"""

import logging
import os

from botocore.exceptions import BotoCoreError, ClientError

from ddb_athena.lib.declarations import UndeclaredStreamError, streamed_table_of
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import ChangeFileNamer, change_record, write_change_file

logger = logging.getLogger(__name__)
_namer = ChangeFileNamer()


def _failure(sequence_number: str) -> dict:
    return {"batchItemFailures": [{"itemIdentifier": sequence_number}], "changeFile": None}


def handle_stream_event(event: dict, s3, layout: SourceLayout, namer: ChangeFileNamer = _namer) -> dict:
    stream_records = event.get("Records", [])
    records, failed_at = [], None
    for stream_record in stream_records:
        try:
            records.append(change_record(stream_record))
        except (KeyError, TypeError, ValueError) as error:
            # Without a sequence number there is nothing to retry from: fail the batch (the mapping bisects it).
            failed_at = stream_record["dynamodb"]["SequenceNumber"]
            logger.error("Unreadable stream record %s (%s: %s); retrying from it", failed_at, type(error).__name__, error)
            break
    if not records:
        return _failure(failed_at) if failed_at else {"batchItemFailures": [], "changeFile": None}
    try:
        # Lambda events do not name the shard; ordering needs only the sequence numbers.
        key = write_change_file(s3, layout, namer.next_name("lambda"), records)
    except (BotoCoreError, ClientError) as error:
        first = stream_records[0]["dynamodb"]["SequenceNumber"]
        logger.error("Could not write the change file of %d records (%s); retrying the batch from %s", len(records), error, first)
        return _failure(first)
    return {"batchItemFailures": [{"itemIdentifier": failed_at}] if failed_at else [], "changeFile": key}


def source_prefix(event: dict, environ) -> str | None:
    """The source prefix of the streamed table whose stream sent `event` (from its records' eventSourceARN,
    `arn:aws:dynamodb:<region>:<account>:table/<name>/stream/<label>`); None for an event without records."""
    arns = {record["eventSourceARN"] for record in event.get("Records", [])}
    if not arns:
        return None
    prefixes = {streamed_table_of(arn, environ).source_prefix for arn in arns}
    if len(prefixes) > 1:
        raise UndeclaredStreamError(f"one batch from the streams of several tables: {sorted(prefixes)}")
    return prefixes.pop()


def handler(event: dict, context) -> dict:
    import boto3

    prefix = source_prefix(event, os.environ)
    if prefix is None:
        return {"batchItemFailures": [], "changeFile": None}
    return handle_stream_event(event, boto3.client("s3"), SourceLayout(os.environ["DDB_ATHENA_BUCKET"], prefix))
