"""Change files: where they live in S3, how they are named, what one record holds.

A change file is JSON Lines, one record per stream change (or per scanned item for a bootstrap).
Names start with the capture time in UTC, so that lexical order is capture order.
"""

import itertools
import json
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Any

from ddb_athena.lake.dynamodb_json import item_to_wire
from ddb_athena.lib.source_layout import SourceLayout

EVENT_NAMES = ("INSERT", "MODIFY", "REMOVE", "SNAPSHOT")
SNAPSHOT_KIND = "snapshot"
# What a producer must name its files (docs/design.md, "The change-file contract").
CHANGE_FILE_NAME_FORMAT = "<capture time, UTC, YYYYMMDDTHHMMSS.ffffffZ>-<kind: lowercase letters>-<tag: letters and digits>.jsonl"
_NAME = re.compile(r"(?P<stamp>\d{8}T\d{6}\.\d{6}Z)-(?P<kind>[a-z]+)-(?P<tag>[A-Za-z0-9]+)\.jsonl")
_STAMP_FORMAT = "%Y%m%dT%H%M%S.%fZ"


@dataclass(frozen=True)
class ChangeRecord:
    event_name: str
    keys: Mapping[str, Any]
    new_image: Mapping[str, Any] | None
    sequence_number: str
    approximate_creation_time: str
    shard_id: str | None = None

    def to_json(self) -> str:
        # The fields by hand: dataclasses.asdict deep-copies the images first, most of a capture's CPU
        # (`make bench-capture`).
        record = {name: getattr(self, name) for name in _RECORD_FIELDS}
        return json.dumps(record, sort_keys=True, separators=(",", ":"))


def _utc_iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def created_at(stream_record: Mapping[str, Any]) -> datetime:
    """A stream record's ApproximateCreationDateTime, in UTC: boto3 gives a datetime; Lambda events, epoch seconds."""
    value = stream_record["dynamodb"]["ApproximateCreationDateTime"]
    return (value if isinstance(value, datetime) else datetime.fromtimestamp(float(value), tz=UTC)).astimezone(UTC)


def change_record(stream_record: Mapping[str, Any], shard_id: str | None = None) -> ChangeRecord:
    """A DynamoDB Streams record (from boto3's get_records or a Lambda event) as a ChangeRecord."""
    change = stream_record["dynamodb"]
    new_image = change.get("NewImage")
    return ChangeRecord(
        event_name=stream_record["eventName"],
        keys=item_to_wire(change["Keys"]),
        new_image=item_to_wire(new_image) if new_image is not None else None,
        sequence_number=change["SequenceNumber"],
        approximate_creation_time=_utc_iso(created_at(stream_record)),
        shard_id=shard_id,
    )


def snapshot_record(item: Mapping[str, Any], key_attributes: tuple[str, ...], scanned_at: datetime, stream_position: str = "0") -> ChangeRecord:
    """A scanned item, ranked at `stream_position` (the stream's end before the scan): above every change older than
    the scan, below every change made from its start on."""
    wire_item = item_to_wire(item)
    return ChangeRecord(
        event_name="SNAPSHOT",
        keys={attribute: wire_item[attribute] for attribute in key_attributes},
        new_image=wire_item,
        sequence_number=stream_position,
        approximate_creation_time=_utc_iso(scanned_at),
    )


_RECORD_FIELDS = tuple(field.name for field in fields(ChangeRecord))


class ChangeFileNamer:
    """Names that sort in capture order, strictly increasing within one process."""

    def __init__(self, clock=lambda: datetime.now(UTC)):
        self._clock = clock
        self._last: datetime | None = None

    def next_name(self, kind: str) -> str:
        moment = self._clock().astimezone(UTC)
        if self._last is not None and moment <= self._last:
            moment = self._last + timedelta(microseconds=1)
        self._last = moment
        return change_file_name(moment, kind)


def change_file_name(captured_at: datetime, kind: str) -> str:
    if not re.fullmatch(r"[a-z]+", kind):
        raise ValueError(f"change file kind {kind!r} must be lowercase letters")
    stamp = captured_at.astimezone(UTC).strftime(_STAMP_FORMAT)
    return f"{stamp}-{kind}-{uuid.uuid4().hex[:12]}.jsonl"


def parse_change_file_name(name: str) -> tuple[datetime, str]:
    """(capture time, kind) of a change file name (the last path segment is enough)."""
    match = _NAME.fullmatch(name.rsplit("/", 1)[-1])
    if not match:
        raise ValueError(f"{name!r} is not a change file name")
    stamp = datetime.strptime(match["stamp"], _STAMP_FORMAT).replace(tzinfo=UTC)
    return stamp, match["kind"]


def is_change_file(key: str) -> bool:
    return _NAME.fullmatch(key.rsplit("/", 1)[-1]) is not None


def write_change_file(s3, layout: SourceLayout, name: str, records: Iterable[ChangeRecord]) -> str:
    """Writes the file once (never overwrites an existing one) and returns its key."""
    key = layout.changes_prefix + name
    s3.put_object(Bucket=layout.bucket, Key=key, Body=change_file_body(records), IfNoneMatch="*", ContentType="application/x-ndjson")
    return key


def change_file_body(records: Iterable[ChangeRecord]) -> bytes:
    """A change file's content: one JSON object per line."""
    return "".join(record.to_json() + "\n" for record in records).encode("utf-8")


def list_keys(s3, bucket: str, prefix: str) -> Iterator[dict]:
    """Every object under `prefix`, in key order."""
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        yield from page.get("Contents", [])


def list_change_files(s3, layout: SourceLayout) -> list[str]:
    """Keys of the change files present now, in capture order."""
    return change_file_keys(list_keys(s3, layout.bucket, layout.changes_prefix))


def change_file_keys(listed: Iterable[dict]) -> list[str]:
    """Keys of the change files among listed objects, in capture order."""
    return sorted(obj["Key"] for obj in listed if is_change_file(obj["Key"]))


def batched(iterable: Iterable, size: int) -> Iterator[list]:
    iterator = iter(iterable)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk
