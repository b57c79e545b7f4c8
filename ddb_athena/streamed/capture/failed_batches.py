"""Batches the capture Lambda gave up on: kept in S3, counted for a check, and captured again from the stream.

The event source mapping sends a batch whose retries or record age ran out to its on-failure queue, as a message
that names the batch's shard and sequence-number range (`DDBStreamBatchInfo`), not its records. A queue drops a
message after at most 14 days, which would turn the check green with the changes still missing, so each message is
moved to an S3 object of its table's source (`failures_prefix`, named by its message id: moved twice, it is one
object) as soon as the check or `replay` sees it, and deleted from the queue once that object is durable. Until its
range is captured again its changes are missing from the table: the objects turn the check red, and `replay` reads
each range back from the stream into a change file (kind `replay`) and only then deletes its object. A replayed
change merges like any other: one older than what the table holds for its key is skipped by sequence number, and
deletes are remembered, so replaying late never moves a key back. A range the stream no longer holds (24 hours)
cannot be replayed: its object stays until a bootstrap's published snapshot covers it (`forget_covered`). A range
not read to its end sequence number (its shard ends before it, or it is not reached within a bounded number of
GetRecords calls) is not replayed either: its object stays for a later replay, never deleted on a part of its records.
"""

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from botocore.exceptions import ClientError

from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import ChangeFileNamer, change_record, list_keys, write_change_file
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
        """Batches left to capture again."""
        return len(self.not_replayable) + len(self.unfinished)


def keep_failed_batches(sqs, s3, queue_url: str, layout_of: Callable[[str], SourceLayout]) -> int:
    """Moves every message in the queue to an S3 object in the source of its stream's table (`layout_of` a stream
    ARN), deleting it from the queue once the object is durable; how many it moved."""
    moved = 0
    while True:
        # Messages another caller is moving stay invisible to this one for a minute: the loop ends.
        messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=60).get("Messages", [])
        if not messages:
            return moved
        for message in messages:
            layout = layout_of(FailedBatch.from_message(message["Body"]).stream_arn)
            s3.put_object(Bucket=layout.bucket, Key=f"{layout.failures_prefix}{message['MessageId']}.json", Body=message["Body"].encode("utf-8"))
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
            moved += 1


def kept_batch_keys(s3, layout: SourceLayout) -> list[str]:
    """The S3 keys of the batches kept in `layout`'s source (one listing: what the check counts)."""
    return [entry["Key"] for entry in list_keys(s3, layout.bucket, layout.failures_prefix)]


def kept_failed_batches(s3, layout: SourceLayout) -> dict[str, FailedBatch]:
    """The batches kept in `layout`'s source, by S3 key (each read: what a replay and a bootstrap need)."""
    return {key: FailedBatch.from_message(s3.get_object(Bucket=layout.bucket, Key=key)["Body"].read().decode("utf-8")) for key in kept_batch_keys(s3, layout)}


def forget_covered(s3, layout: SourceLayout, snapshot_position: str) -> int:
    """Once a bootstrap's snapshot is published: the kept batches that end at or below its position (the stream's end
    before its scan, which read every item after their changes) are deleted; how many."""
    covered = [key for key, batch in kept_failed_batches(s3, layout).items() if int(batch.last_sequence) <= int(snapshot_position)]
    for key in covered:
        s3.delete_object(Bucket=layout.bucket, Key=key)
    return len(covered)


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


def replay(streams, s3, layouts: Iterable[SourceLayout], log: Callable[[str], None], namer: ChangeFileNamer | None = None) -> ReplayResult:
    """Captures every batch kept in `layouts` (see `keep_failed_batches`) again, into its source's change files; a
    batch's object is deleted once its change file is durable."""
    namer, result = namer or ChangeFileNamer(), ReplayResult()
    for layout in layouts:
        for key, batch in kept_failed_batches(s3, layout).items():
            try:
                records = read_range(streams, batch)
            except RangeGoneError as error:
                result.not_replayable.append(batch)
                log(f"{error}. {BOOTSTRAP_HINT}")
                continue
            except RangeNotReadError as error:
                result.unfinished.append(batch)
                log(f"{error}; it stays for a later replay")
                continue
            if records:
                key_written = write_change_file(s3, layout, namer.next_name(REPLAY_KIND), [change_record(record, batch.shard_id) for record in records])
                result.replayed.append(key_written)
                result.records += len(records)
            log(f"{batch.range_name}: {len(records)} records captured again")
            s3.delete_object(Bucket=layout.bucket, Key=key)
    return result
