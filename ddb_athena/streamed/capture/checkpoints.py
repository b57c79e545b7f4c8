"""Per-shard stream checkpoints, kept in S3 beside the change files they describe."""

import json
import re
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
