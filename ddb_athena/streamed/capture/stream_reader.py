"""Reads a table's DynamoDB stream into change files: every shard, parents before children.

A shard's checkpoint advances only after the change file holding its records is durable, so a
crash at any point re-reads, never skips. Losing records to the stream's 24-hour trim is
detected and reported, never papered over: the way back is a bootstrap. That includes a shard read while it was
empty: its checkpoint has no record to resume after, so it keeps when it was seen empty, and a read from TRIM_HORIZON
longer than the retention after that must find the shard's first record still there. The same holds for a child shard
never read (a capture bound that stopped before it, behind a busy shard or a day-long backlog) whose parent was read
to its end longer than the retention ago: the child began before that.

As AWS documents GetRecords, an empty page is not the end of a shard ("it might take multiple calls to get to a
portion of the shard that contains stream records"): a closed shard is read until GetRecords returns no next
iterator, an open one until several pages in a row come back empty (caught up). A finished shard's checkpoint is
deleted once a child has one of its own: each capture reads the open shards' checkpoints, not the stream's history.
"""

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from botocore.exceptions import ClientError

from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import ChangeFileNamer, ChangeRecord, change_record, created_at, write_change_file
from ddb_athena.streamed.capture.checkpoints import CheckpointStore, CommittedCheckpoints, ShardCheckpoint

BOOTSTRAP_HINT = (
    "Recover with a bootstrap (a full scan ordered before the stream's remaining changes): `ddb-athena bootstrap books`, "
    "or launch the books_bootstrap job from the Dagster UI. It waits for the running sync to end its cycle, and the "
    "sync resumes after it."
)


# Empty pages in a row after which an open shard counts as caught up (each is one GetRecords request).
EMPTY_PAGES_CAUGHT_UP = 3
# A record stamped at least this long after a capture began was written after it (DynamoDB rounds a record's
# ApproximateCreationDateTime down to the second): a shard read to such a record is read to where the stream ended
# when the capture began. A shard written to all the time never reads empty; without this the capture would chase
# its tail until its time bound (the cycle's interval) and the cycle would merge that much later.
WRITTEN_AFTER_START = timedelta(seconds=1)
# The stream trims only records older than 24 hours: a shard seen empty less than this long ago cannot have lost a
# record written since. An hour short of the retention, for clocks that disagree.
TRIM_SAFE_AGE = timedelta(hours=23)
# A shard that keeps reading empty has its `seen_empty_at` written again once it is this old: one checkpoint write an
# hour for a quiet shard rather than one a capture, and far inside TRIM_SAFE_AGE while the captures run.
EMPTY_SHARD_RESTAMP_AGE = timedelta(hours=1)


class StreamGapError(RuntimeError):
    """Changes that were never captured are no longer in the stream."""


class StreamNotEnabledError(RuntimeError):
    pass


@dataclass
class CaptureResult:
    stream_arn: str
    change_files: list[str] = field(default_factory=list)
    records: int = 0
    events: Counter = field(default_factory=Counter)
    shards_read: int = 0
    newest_change_at: str | None = None
    # False when the capture stopped at its time or record bound with records left in the stream: it is behind.
    caught_up: bool = True


def _error_code(error: ClientError) -> str:
    return error.response.get("Error", {}).get("Code", "")


def latest_stream_arn(dynamodb, table_name: str) -> str:
    table = dynamodb.describe_table(TableName=table_name)["Table"]
    spec = table.get("StreamSpecification") or {}
    if not spec.get("StreamEnabled") or "LatestStreamArn" not in table:
        raise StreamNotEnabledError(
            f"DynamoDB table {table_name!r} has no stream. Enable it with: aws dynamodb update-table "
            f"--table-name {table_name} --stream-specification StreamEnabled=true,StreamViewType=NEW_AND_OLD_IMAGES"
        )
    return table["LatestStreamArn"]


def list_shards(streams, stream_arn: str) -> list[dict]:
    shards, start = [], None
    while True:
        kwargs = {"StreamArn": stream_arn, **({"ExclusiveStartShardId": start} if start else {})}
        description = streams.describe_stream(**kwargs)["StreamDescription"]
        shards.extend(description.get("Shards", []))
        start = description.get("LastEvaluatedShardId")
        if not start:
            return shards


def finished_shards(checkpoints: dict[str, ShardCheckpoint]) -> set[str]:
    """Shards read to their end: finished checkpoints, and the parents of shards with a checkpoint (a child is read
    only once its parent is finished, and the parent's checkpoint is deleted after that)."""
    return {c.shard_id for c in checkpoints.values() if c.finished} | {c.parent_shard_id for c in checkpoints.values() if c.parent_shard_id}


def parents_first(shards: list[dict]) -> list[dict]:
    """Shards ordered so that every parent comes before its children (AWS's processing rule)."""
    by_id = {shard["ShardId"]: shard for shard in shards}
    ordered, seen = [], set()

    def visit(shard: dict) -> None:
        if shard["ShardId"] in seen:
            return
        parent = by_id.get(shard.get("ParentShardId"))
        if parent is not None:
            visit(parent)
        seen.add(shard["ShardId"])
        ordered.append(shard)

    for shard in sorted(shards, key=lambda s: s["SequenceNumberRange"].get("StartingSequenceNumber", "").zfill(40)):
        visit(shard)
    return ordered


def _starting_after(shards: list[dict], stopped_at: str | None) -> list[dict]:
    """`shards` (parents first) rotated to start after `stopped_at`: a child that comes before its parent then waits
    for the next capture, as it would behind an unfinished parent."""
    ids = [shard["ShardId"] for shard in shards]
    if stopped_at not in ids:
        return shards
    after = ids.index(stopped_at) + 1
    return shards[after:] + shards[:after]


class StreamCapture:
    """Captures one table's stream into `layout`'s change files."""

    def __init__(
        self,
        dynamodb,
        streams,
        s3,
        table_name: str,
        layout: SourceLayout,
        namer: ChangeFileNamer | None = None,
        records_per_file: int = 10_000,
        max_records: int = 200_000,
        log: Callable[[str], None] = lambda message: None,
        max_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_page: Callable[[], None] = lambda: None,
        checkpoints: CheckpointStore | CommittedCheckpoints | None = None,
        write_changes: Callable[[str, list[ChangeRecord]], str] | None = None,
    ):
        """`checkpoints`: where the positions are kept (default: in S3, each saved once its change file is durable);
        `write_changes(name, records)`: where change files go (default: the layout's change prefix in S3).

        A capture reads until it has caught up with the stream, or holds `max_records`, or has read for
        `max_seconds`: behind a stream it cannot keep up with, each capture still ends, so the cycle merges what it
        has and the table keeps moving; the next capture goes on from the checkpoints."""
        self._dynamodb, self._streams = dynamodb, streams
        self._table_name = table_name
        self._checkpoints = checkpoints or CheckpointStore(s3, layout)
        self._write_changes = write_changes or (lambda name, records: write_change_file(s3, layout, name, records))
        self._namer = namer or ChangeFileNamer()
        self._records_per_file = records_per_file
        self._max_records = max_records
        self._log = log
        self._max_seconds, self._clock = max_seconds, clock
        # Called after each GetRecords page: a long read is progress for the writer's lease (and stops when it is lost).
        self._on_page = on_page
        self._deadline = float("inf")
        self._bounded = True
        self._written_after: datetime | None = None
        # The shard at which the last capture reached its bound: the next one starts after it, so that a busy shard
        # never starves the others (which the trim would then take).
        self._stopped_at: str | None = None

    def present_end(self) -> list[ShardCheckpoint]:
        """Where the stream ends now, shard by shard (read from each shard's oldest record, the records discarded; saved
        nowhere): a bootstrap takes it before its scan, and its capture resumes from there once the scan is sealed, so
        no record older than the scan is applied after it. Costs one read of the retained stream."""
        stream_arn = latest_stream_arn(self._dynamodb, self._table_name)
        positions = []
        for shard in parents_first(list_shards(self._streams, stream_arn)):
            closed = "EndingSequenceNumber" in shard.get("SequenceNumberRange", {})
            checkpoint = ShardCheckpoint(stream_arn, shard["ShardId"], shard.get("ParentShardId"))
            read_started_at = datetime.now(UTC)
            iterator, empty_pages = self._iterator(checkpoint), 0
            while iterator is not None and (closed or empty_pages < EMPTY_PAGES_CAUGHT_UP):
                response = self._streams.get_records(ShardIterator=iterator, Limit=1000)
                self._on_page()
                records = response.get("Records", [])
                if records:
                    checkpoint = replace(checkpoint, sequence_number=records[-1]["dynamodb"]["SequenceNumber"])
                empty_pages = 0 if records else empty_pages + 1
                iterator = response.get("NextShardIterator")
            if checkpoint.sequence_number is None:
                checkpoint = replace(checkpoint, seen_empty_at=read_started_at.isoformat())
            positions.append(replace(checkpoint, finished=iterator is None))
        return positions

    @staticmethod
    def newest(positions: list[ShardCheckpoint]) -> str:
        """The newest sequence number among `positions` ("0" for a stream without records): DynamoDB numbers a
        stream's records in the order it publishes them, so every record made after these positions is above it."""
        return str(max((int(position.sequence_number) for position in positions if position.sequence_number), default=0))

    def restart_from(self, positions: list[ShardCheckpoint]) -> None:
        """Replaces every checkpoint with `positions` (a bootstrap's `present_end`, once its snapshot is sealed)."""
        self._checkpoints.delete_all()
        for checkpoint in positions:
            self._checkpoints.save(checkpoint)

    def capture(self, bounded: bool = True) -> CaptureResult:
        """Reads from the checkpoints; `bounded=False` ignores `max_seconds` and `max_records` (a bootstrap reads through
        its scan's end)."""
        stream_arn = latest_stream_arn(self._dynamodb, self._table_name)
        all_checkpoints = self._checkpoints.load_all()
        checkpoints = {c.shard_id: c for c in all_checkpoints if c.stream_arn == stream_arn}
        if all_checkpoints and not checkpoints:
            raise StreamGapError(
                f"The stream of {self._table_name!r} changed (now {stream_arn}); changes made before it was re-created cannot be read. {BOOTSTRAP_HINT}"
            )
        shards = parents_first(list_shards(self._streams, stream_arn))
        finished = finished_shards(checkpoints)
        self._fail_on_gaps(shards, checkpoints, finished)

        result = CaptureResult(stream_arn=stream_arn)
        self._bounded = bounded
        self._deadline = self._clock() + self._max_seconds if self._max_seconds is not None else float("inf")
        self._written_after = datetime.now(UTC) + WRITTEN_AFTER_START
        listed = {shard["ShardId"] for shard in shards}
        stopped_at, self._stopped_at = self._stopped_at, None
        for shard in _starting_after(shards, stopped_at):
            shard_id, parent_id = shard["ShardId"], shard.get("ParentShardId")
            if shard_id in finished:
                continue
            if parent_id in listed and parent_id not in finished:
                continue  # the parent still has unread records; children wait for the next capture
            if self._bound_reached(result.records):
                result.caught_up = False
                break
            checkpoint = checkpoints.get(shard_id) or ShardCheckpoint(stream_arn, shard_id, parent_id)
            checkpoints[shard_id] = self._capture_shard(checkpoint, shard, result, checkpoints.get(parent_id))
            if checkpoints[shard_id].finished:
                finished.add(shard_id)
            if self._bound_reached(result.records):
                self._stopped_at = shard_id
        self._prune(shards, checkpoints)
        return result

    def _prune(self, shards: list[dict], checkpoints: dict[str, ShardCheckpoint]) -> None:
        """Deletes the checkpoints of finished shards whose children all have one of their own (each names its parent,
        which is then known as finished without its own checkpoint)."""
        children: dict[str, list[str]] = {}
        for shard in shards:
            children.setdefault(shard.get("ParentShardId"), []).append(shard["ShardId"])
        for checkpoint in list(checkpoints.values()):
            kids = children.get(checkpoint.shard_id, [])
            if checkpoint.finished and kids and all(kid in checkpoints for kid in kids):
                self._checkpoints.delete(checkpoint)
                del checkpoints[checkpoint.shard_id]

    def _fail_on_gaps(self, shards: list[dict], checkpoints: dict[str, ShardCheckpoint], finished: set[str]) -> None:
        listed = {shard["ShardId"] for shard in shards}
        for checkpoint in checkpoints.values():
            if not checkpoint.finished and checkpoint.shard_id not in listed:
                raise StreamGapError(
                    f"Shard {checkpoint.shard_id} was trimmed from the stream before it was read to its end "
                    f"(last captured sequence {checkpoint.sequence_number}). {BOOTSTRAP_HINT}"
                )
        if not checkpoints:
            return  # first capture of this stream: history before it comes from the bootstrap scan
        for shard in shards:
            parent = shard.get("ParentShardId")
            if shard["ShardId"] not in checkpoints.keys() | finished and parent and parent not in listed and parent not in finished:
                raise StreamGapError(f"Shard {shard['ShardId']} descends from {parent}, which was trimmed before it was captured. {BOOTSTRAP_HINT}")

    def _iterator(self, checkpoint: ShardCheckpoint) -> str:
        kwargs = {"StreamArn": checkpoint.stream_arn, "ShardId": checkpoint.shard_id}
        if checkpoint.sequence_number:
            kwargs.update(ShardIteratorType="AFTER_SEQUENCE_NUMBER", SequenceNumber=checkpoint.sequence_number)
        else:
            kwargs.update(ShardIteratorType="TRIM_HORIZON")
        try:
            return self._streams.get_shard_iterator(**kwargs)["ShardIterator"]
        except ClientError as error:
            if _error_code(error) == "TrimmedDataAccessException":
                raise StreamGapError(
                    f"Shard {checkpoint.shard_id}: records after sequence {checkpoint.sequence_number} were trimmed "
                    f"(older than the stream's 24-hour retention) before they were captured. {BOOTSTRAP_HINT}"
                ) from error
            raise

    def _capture_shard(self, checkpoint: ShardCheckpoint, shard: dict, result: CaptureResult, parent: ShardCheckpoint | None) -> ShardCheckpoint:
        closed = "EndingSequenceNumber" in shard.get("SequenceNumberRange", {})
        read_started_at = datetime.now(UTC)
        unread_since = _seen_empty_longer_than_retention_ago(checkpoint, read_started_at) or _unread_longer_than_retention(checkpoint, parent, read_started_at)
        iterator: str | None = self._iterator(checkpoint)
        pending: list[ChangeRecord] = []
        last_read = checkpoint.sequence_number
        empty_pages, reached_the_start = 0, False
        result.shards_read += 1
        while iterator is not None and not self._bound_reached(result.records + len(pending)):
            try:
                response = self._streams.get_records(ShardIterator=iterator, Limit=1000)
                self._on_page()
            except ClientError as error:
                if _error_code(error) != "ExpiredIteratorException":
                    raise
                # Iterators live 15 minutes; resume right after the last record we hold.
                self._log(f"shard {checkpoint.shard_id}: iterator expired, renewing after {last_read}")
                iterator = self._iterator(replace(checkpoint, sequence_number=last_read))
                continue
            records = response.get("Records", [])
            if records and unread_since:
                _fail_unless_first_of_shard(checkpoint, shard, records[0], unread_since)
                unread_since = None
            pending.extend(change_record(record, checkpoint.shard_id) for record in records)
            if records:
                last_read = records[-1]["dynamodb"]["SequenceNumber"]
            iterator = response.get("NextShardIterator")
            if len(pending) >= self._records_per_file:
                checkpoint = self._flush(checkpoint, pending, result, finished=False)
                pending = []
            empty_pages = 0 if records else empty_pages + 1
            reached_the_start = bool(records) and self._written_after is not None and created_at(records[-1]) >= self._written_after
            if not closed and (empty_pages >= EMPTY_PAGES_CAUGHT_UP or reached_the_start):
                break  # caught up with an open shard (what was written since waits for the next capture)
        read_to_present_end = iterator is None or (not closed and (empty_pages >= EMPTY_PAGES_CAUGHT_UP or reached_the_start))
        if not read_to_present_end:
            result.caught_up = False  # stopped at a bound with the shard not read to its end
        if unread_since and read_to_present_end:
            raise StreamGapError(
                f"Shard {checkpoint.shard_id} {unread_since}, longer ago than the stream keeps records (24 hours), and reads "
                f"empty now: whatever was written to it since may have been trimmed before it was captured. {BOOTSTRAP_HINT}"
            )
        seen_empty = checkpoint.sequence_number is None and not pending and read_to_present_end
        restamp = seen_empty and _empty_stamp_due(checkpoint, read_started_at)
        return self._flush(checkpoint, pending, result, finished=iterator is None, seen_empty_at=read_started_at if restamp else None)

    def _bound_reached(self, records: int) -> bool:
        return self._bounded and (records >= self._max_records or self._clock() >= self._deadline)

    def _flush(
        self, checkpoint: ShardCheckpoint, records: list[ChangeRecord], result: CaptureResult, finished: bool, seen_empty_at: datetime | None = None
    ) -> ShardCheckpoint:
        # A shard's first checkpoint is written even with no record: it names the parent, finished from then on.
        if not records and not finished and seen_empty_at is None and checkpoint.updated_at is not None:
            return checkpoint
        if seen_empty_at is not None:
            checkpoint = replace(checkpoint, seen_empty_at=seen_empty_at.isoformat())
        if records:
            key = self._write_changes(self._namer.next_name("stream"), records)
            result.change_files.append(key)
            result.records += len(records)
            result.events.update(record.event_name for record in records)
            newest = max(record.approximate_creation_time for record in records)
            result.newest_change_at = max(filter(None, [result.newest_change_at, newest]))
            checkpoint = replace(checkpoint, sequence_number=records[-1].sequence_number, change_file=key)
        # Only now that the file is durable does the position move.
        return self._checkpoints.save(replace(checkpoint, finished=finished))


def _seen_empty_longer_than_retention_ago(checkpoint: ShardCheckpoint, now: datetime) -> str | None:
    """When a shard with no record captured yet was last seen empty, if that is so long ago that records written to it
    since may have been trimmed (said as the errors say it); None when nothing can have been (or the shard was never read)."""
    if checkpoint.sequence_number is not None or checkpoint.updated_at is None or checkpoint.finished:
        return None
    # A checkpoint written before `seen_empty_at` existed: its first (empty) read is the last one known.
    seen_empty_at = checkpoint.seen_empty_at or checkpoint.updated_at
    return f"was seen empty at {seen_empty_at}" if now - datetime.fromisoformat(seen_empty_at) > TRIM_SAFE_AGE else None


def _unread_longer_than_retention(checkpoint: ShardCheckpoint, parent: ShardCheckpoint | None, now: datetime) -> str | None:
    """A shard never read whose parent was read to its end so long ago that the child, which began before that, may
    have lost its first records to the trim (a capture bound that never reached it across a day-long backlog); None
    when it cannot have. A shard whose parent this capture never read starts the stream's history: the bootstrap's."""
    if checkpoint.updated_at is not None or parent is None or not parent.finished or parent.updated_at is None:
        return None
    if now - datetime.fromisoformat(parent.updated_at) <= TRIM_SAFE_AGE:
        return None
    return f"was not read since its parent {parent.shard_id} was read to its end at {parent.updated_at}"


def _empty_stamp_due(checkpoint: ShardCheckpoint, now: datetime) -> bool:
    return checkpoint.seen_empty_at is None or now - datetime.fromisoformat(checkpoint.seen_empty_at) >= EMPTY_SHARD_RESTAMP_AGE


def _fail_unless_first_of_shard(checkpoint: ShardCheckpoint, shard: dict, oldest_record: dict, unread_since: str) -> None:
    """TRIM_HORIZON starts at the oldest record not trimmed. Only if that is the shard's first (the start of its
    sequence-number range) is it sure that nothing was trimmed since the shard was last read. AWS documents that start
    as the first sequence number of the shard's range, not as its first record's own: a mismatch may be a loss, and is
    treated as one."""
    first_of_shard = shard.get("SequenceNumberRange", {}).get("StartingSequenceNumber")
    oldest = oldest_record["dynamodb"]["SequenceNumber"]
    if first_of_shard is None or int(oldest) != int(first_of_shard):
        raise StreamGapError(
            f"Shard {checkpoint.shard_id} {unread_since}, longer ago than the stream keeps records (24 hours), "
            f"and its oldest record now ({oldest}) is not its first ({first_of_shard}): records written to it since may have been "
            f"trimmed before they were captured. {BOOTSTRAP_HINT}"
        )
