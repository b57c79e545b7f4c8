"""Batches the capture Lambda gave up on: counted for a check, and captured again from the stream while it holds them.

The event source mapping sends a batch whose retries or record age ran out to its on-failure queue, as a message
that names the batch's shard and sequence-number range (`DDBStreamBatchInfo`), not its records. Until the range is
captured again its changes are missing from the table: the queue's depth turns a check red, and `replay` reads
each range back from the stream into a change file (kind `replay`) and only then deletes its message. A replayed
change merges like any other: one older than what the table holds for its key is skipped by sequence number, and
deletes are remembered, so replaying late never moves a key back. A range the stream no longer holds (24 hours)
cannot be replayed: its message stays, and the way back is a bootstrap. A range not read to its end sequence number
(its shard ends before it, or it is not reached within a bounded number of GetRecords calls) is not replayed either:
its message stays for a later replay, never deleted on a part of its records.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from botocore.exceptions import ClientError

from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import ChangeFileNamer, change_record, write_change_file
from ddb_athena.streamed.capture.stream_reader import BOOTSTRAP_HINT

REPLAY_KIND = "replay"
# Where the stream no longer holds a range: trimmed records, or a shard (or stream) gone.
_GONE = {"TrimmedDataAccessException", "ResourceNotFoundException"}
# GetRecords calls allowed to read one range. A batch is at most 10,000 records and one Lambda payload (6 MB), so at most
# about ten full pages (1,000 records or 1 MB each); the rest allows for empty pages on the way.
MAX_PAGES_PER_RANGE = 50


@dataclass(frozen=True)
class FailedBatch:
    stream_arn: str
    shard_id: str
    first_sequence: str
    last_sequence: str
    size: int

    @classmethod
    def from_message(cls, body: str) -> "FailedBatch":
        info = json.loads(body)["DDBStreamBatchInfo"]
        return cls(info["streamArn"], info["shardId"], info["startSequenceNumber"], info["endSequenceNumber"], int(info.get("batchSize", 0)))

    def holds(self, sequence: str) -> bool:
        return int(self.first_sequence) <= int(sequence) <= int(self.last_sequence)

    @property
    def range_name(self) -> str:
        return f"{self.shard_id} {self.first_sequence}..{self.last_sequence}"


class RangeNotReadError(RuntimeError):
    """A failed batch's range that could not be read to its end: its message stays in the queue."""


class RangeGoneError(RangeNotReadError):
    """A failed batch's range (or its start) that the stream no longer holds: only a bootstrap brings its changes back."""


@dataclass
class ReplayResult:
    replayed: list[str] = field(default_factory=list)  # change files written
    records: int = 0
    not_replayable: list[FailedBatch] = field(default_factory=list)  # no longer in the stream
    unfinished: list[FailedBatch] = field(default_factory=list)  # not read to their end this time

    @property
    def kept(self) -> int:
        """Messages left in the queue."""
        return len(self.not_replayable) + len(self.unfinished)


def failure_queue_depth(sqs, queue_url: str) -> int:
    """Messages in the queue, visible or being handled: batches not yet captured again."""
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])[
        "Attributes"
    ]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def read_range(streams, batch: FailedBatch) -> list[dict]:
    """The stream records of the batch's range, read from its first sequence number until one at or past its last.

    Raises RangeGoneError when the stream no longer holds the range's start, RangeNotReadError when its end is not
    reached (the shard ends before it, or MAX_PAGES_PER_RANGE calls go by): a part of a range is never returned as all
    of it."""
    try:
        iterator = streams.get_shard_iterator(
            StreamArn=batch.stream_arn, ShardId=batch.shard_id, ShardIteratorType="AT_SEQUENCE_NUMBER", SequenceNumber=batch.first_sequence
        )["ShardIterator"]
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") not in _GONE:
            raise
        raise RangeGoneError(f"{batch.range_name}: no longer in the stream") from error
    records: list[dict] = []
    pages = 0
    while iterator is not None and pages < MAX_PAGES_PER_RANGE:
        response = streams.get_records(ShardIterator=iterator, Limit=1000)
        pages += 1
        page = response.get("Records", [])
        if page and not records:
            # The range's first sequence number is its first record's: a read at it that starts on another record
            # started at the oldest one left, past a trimmed start.
            first_read = page[0]["dynamodb"]["SequenceNumber"]
            if int(first_read) != int(batch.first_sequence):
                raise RangeGoneError(f"{batch.range_name}: its start is no longer in the stream (the oldest record there is {first_read})")
        records += [record for record in page if batch.holds(record["dynamodb"]["SequenceNumber"])]
        if page and int(page[-1]["dynamodb"]["SequenceNumber"]) >= int(batch.last_sequence):
            return records
        iterator = response.get("NextShardIterator")
    if iterator is None:
        raise RangeNotReadError(f"{batch.range_name}: not read to its end, the shard ends before it")
    raise RangeNotReadError(f"{batch.range_name}: not read to its end within {MAX_PAGES_PER_RANGE} GetRecords calls")


def replay(
    sqs, streams, s3, queue_url: str, layout_of: Callable[[str], SourceLayout], log: Callable[[str], None], namer: ChangeFileNamer | None = None
) -> ReplayResult:
    """Captures every failed batch in the queue again, into the source layout of its stream's table (`layout_of` a
    stream ARN); a message is deleted once its change file is durable."""
    namer, result = namer or ChangeFileNamer(), ReplayResult()
    while True:
        # Messages kept (gone from the stream, or not read to their end) stay invisible for this call's duration, so the loop ends.
        messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=300).get("Messages", [])
        if not messages:
            return result
        for message in messages:
            batch = FailedBatch.from_message(message["Body"])
            try:
                records = read_range(streams, batch)
            except RangeGoneError as error:
                result.not_replayable.append(batch)
                log(f"{error}. {BOOTSTRAP_HINT}")
                continue
            except RangeNotReadError as error:
                result.unfinished.append(batch)
                log(f"{error}; its message stays for a later replay")
                continue
            if records:
                key = write_change_file(
                    s3, layout_of(batch.stream_arn), namer.next_name(REPLAY_KIND), [change_record(record, batch.shard_id) for record in records]
                )
                result.replayed.append(key)
                result.records += len(records)
            log(f"{batch.shard_id} {batch.first_sequence}..{batch.last_sequence}: {len(records)} records captured again")
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
