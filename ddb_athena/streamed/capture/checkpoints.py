"""Per-shard stream checkpoints, kept in S3 beside the change files they describe."""

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime

from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import list_keys


@dataclass(frozen=True)
class ShardCheckpoint:
    stream_arn: str
    shard_id: str
    parent_shard_id: str | None = None
    # Last sequence number written to a durable change file; None before the first record.
    sequence_number: str | None = None
    # Before the first record: when a read began that found the shard empty to its present end. The stream trims only
    # records older than 24 hours, so until then none written after it can have been lost.
    seen_empty_at: str | None = None
    # True once the shard is closed and read to its end.
    finished: bool = False
    change_file: str | None = None
    updated_at: str | None = None


def stream_label(stream_arn: str) -> str:
    """A key-safe label for a stream (the label AWS puts after `/stream/`)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", stream_arn.rsplit("/stream/", 1)[-1])


class CheckpointStore:
    """The checkpoints in S3, read once and then kept as this store writes them: a table's checkpoints have one
    writer at a time (its lease), so a capture every few seconds need not list and read them all again."""

    def __init__(self, s3, layout: SourceLayout):
        self._s3 = s3
        self._layout = layout
        self._known: dict[str, ShardCheckpoint] | None = None

    def _key(self, stream_arn: str, shard_id: str) -> str:
        return f"{self._layout.checkpoints_prefix}{stream_label(stream_arn)}/{shard_id}.json"

    def load_all(self) -> list[ShardCheckpoint]:
        if self._known is None:
            self._known = {}
            for obj in list_keys(self._s3, self._layout.bucket, self._layout.checkpoints_prefix):
                body = self._s3.get_object(Bucket=self._layout.bucket, Key=obj["Key"])["Body"].read()
                self._known[obj["Key"]] = ShardCheckpoint(**json.loads(body))
        return [self._known[key] for key in sorted(self._known)]

    def save(self, checkpoint: ShardCheckpoint) -> ShardCheckpoint:
        stamped = replace(checkpoint, updated_at=datetime.now(UTC).isoformat())
        key = self._key(stamped.stream_arn, stamped.shard_id)
        self._s3.put_object(
            Bucket=self._layout.bucket, Key=key, Body=json.dumps(asdict(stamped), sort_keys=True).encode("utf-8"), ContentType="application/json"
        )
        if self._known is not None:
            self._known[key] = stamped
        return stamped

    def delete(self, checkpoint: ShardCheckpoint) -> None:
        key = self._key(checkpoint.stream_arn, checkpoint.shard_id)
        self._s3.delete_object(Bucket=self._layout.bucket, Key=key)
        if self._known is not None:
            self._known.pop(key, None)

    def delete_all(self) -> int:
        keys = [obj["Key"] for obj in list_keys(self._s3, self._layout.bucket, self._layout.checkpoints_prefix)]
        for key in keys:
            self._s3.delete_object(Bucket=self._layout.bucket, Key=key)
        self._known = {}
        return len(keys)


class MemoryCheckpoints:
    """Checkpoints in memory only, from `start`: a read of the stream that no later capture resumes (beside the capture
    Lambda, a bootstrap's read through its scan's end)."""

    def __init__(self, start: Iterable[ShardCheckpoint] = ()):
        self._known = {(checkpoint.stream_arn, checkpoint.shard_id): checkpoint for checkpoint in start}

    def load_all(self) -> list[ShardCheckpoint]:
        return [self._known[key] for key in sorted(self._known)]

    def save(self, checkpoint: ShardCheckpoint) -> ShardCheckpoint:
        stamped = replace(checkpoint, updated_at=datetime.now(UTC).isoformat())
        self._known[stamped.stream_arn, stamped.shard_id] = stamped
        return stamped

    def delete(self, checkpoint: ShardCheckpoint) -> None:
        self._known.pop((checkpoint.stream_arn, checkpoint.shard_id), None)

    def delete_all(self) -> int:
        count, self._known = len(self._known), {}
        return count


class CommittedCheckpoints:
    """The checkpoints committed with the data (the in-process capture's): read from the table's published snapshots
    (`load`: `positions_json`'s text, or None when the table holds none), moved by the capture in
    memory only, and made durable by the merge's commit, which carries `positions_json()`. A cycle that fails puts
    them back (`rollback`): its records are read again from the stream by the next capture.

    A table that holds no positions yet (created by a version that kept them in S3, or by a bootstrap still to
    commit) starts from `fallback`: the checkpoints in S3, if any."""

    def __init__(self, load, fallback: CheckpointStore):
        self._load, self.fallback = load, fallback
        self._committed: dict[str, ShardCheckpoint] | None = None
        self._pending: dict[str, ShardCheckpoint] = {}

    def load_all(self) -> list[ShardCheckpoint]:
        self._loaded()
        return [self._pending[key] for key in sorted(self._pending)]

    def _loaded(self) -> None:
        if self._committed is None:
            stored = self._load()
            found = positions_from_json(stored) if stored else self.fallback.load_all()
            self._committed = {self._key(checkpoint): checkpoint for checkpoint in found}
            self._pending = dict(self._committed)

    @staticmethod
    def _key(checkpoint: ShardCheckpoint) -> str:
        return f"{stream_label(checkpoint.stream_arn)}/{checkpoint.shard_id}"

    def save(self, checkpoint: ShardCheckpoint) -> ShardCheckpoint:
        self._loaded()
        stamped = replace(checkpoint, updated_at=datetime.now(UTC).isoformat())
        self._pending[self._key(stamped)] = stamped
        return stamped

    def delete(self, checkpoint: ShardCheckpoint) -> None:
        self._loaded()
        self._pending.pop(self._key(checkpoint), None)

    def delete_all(self) -> int:
        self._loaded()
        count, self._pending = len(self._pending), {}
        return count

    @property
    def changed(self) -> bool:
        """Whether the capture moved a position since the last commit (a shard read to a new record, one seen
        empty, a new or finished shard)."""
        return self._committed is not None and self._pending != self._committed

    def positions_json(self) -> str:
        return positions_json([self._pending[key] for key in sorted(self._pending)])

    def commit(self) -> None:
        """The merge carrying `positions_json()` was published."""
        self._committed = dict(self._pending)

    def rollback(self) -> None:
        self._pending = dict(self._committed or {})


# What a position needs in a snapshot's summary (every snapshot kept lists its summary in each metadata file written).
_POSITION_FIELDS = ("shard_id", "parent_shard_id", "sequence_number", "seen_empty_at", "finished", "updated_at")


def positions_json(checkpoints: list[ShardCheckpoint]) -> str:
    """Compact JSON of `checkpoints` by stream: {stream ARN: [shard fields, unset ones left out]}."""
    streams: dict[str, list[dict]] = {}
    for checkpoint in checkpoints:
        fields = {name: getattr(checkpoint, name) for name in _POSITION_FIELDS if getattr(checkpoint, name) not in (None, False)}
        streams.setdefault(checkpoint.stream_arn, []).append(fields)
    return json.dumps(streams, sort_keys=True, separators=(",", ":"))


def positions_from_json(text: str) -> list[ShardCheckpoint]:
    return [ShardCheckpoint(stream_arn=stream, **fields) for stream, shards in json.loads(text).items() for fields in shards]
