"""Bootstrap: a full scan of the table, written as a snapshot in bounded parts, made visible only once complete.

The snapshot is named at the scan's start. Its parts go to `<prefix>/_snapshots/` (never read by a merge on their
own) as the scan proceeds, each at most `part_bytes`, so memory stays flat and no object nears S3's 5 GB limit of a
single PUT. Once every part is durable, an empty change file of the snapshot's name (the seal) is written to the
change prefix: from then on the merge takes the snapshot, all its parts, as the whole table as of the scan's start.
Files named before it are superseded by it. The capture takes where the stream ends before the scan starts and,
once the snapshot is sealed, resumes from there, reading through the scan's end before the merge publishes: only the
changes made from the scan's start on are applied on top, in stream order. Replaying one the scan already saw is
harmless because every later change of the same key, up to the scan's end, is applied in the same commit. Beside the
capture Lambda, which delivers those changes only when it gets to them, the run that merges the snapshot reads the
stream through its end itself, from where it ended before the scan (or from its oldest record, for a snapshot another
run sealed); the Lambda's copies of the same changes merge later without effect.

A scan that fails leaves parts without a seal: nothing reads them, and the next bootstrap deletes them.
"""

import io
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import (
    SNAPSHOT_KIND,
    ChangeFileNamer,
    list_change_files,
    list_keys,
    parse_change_file_name,
    snapshot_record,
)

# A part's size bound: parts stay far below S3's 5 GB single-PUT limit, and the scan's memory is about one part.
DEFAULT_PART_BYTES = 64 * 1024 * 1024
PROGRESS_ITEMS = 10_000
# The seal's S3 metadata: the stream's end before the scan (an empty table's snapshot has no row to carry it).
STREAM_POSITION_METADATA = "stream-position"
_PART_SUFFIX = re.compile(r"p\d{5}(?=\.jsonl$)")


@dataclass(frozen=True)
class BootstrapResult:
    change_file: str  # the seal
    parts: list[str]
    items: int


def snapshot_group(file_name: str) -> str:
    """The name of the snapshot a part belongs to (the seal's name); a seal's own name is its group."""
    return _PART_SUFFIX.sub("", file_name.rsplit("/", 1)[-1])


def newer_than_applied(file_name: str, applied: str | None) -> bool:
    """Whether the snapshot a seal or part belongs to is newer than the one the table applied (its seal's name, the
    table's bootstrap-file property): names order as their scans started."""
    return snapshot_group(file_name) > (applied or "")


def part_keys(s3, layout: SourceLayout, seal_key: str) -> list[str]:
    """The parts of the snapshot sealed by `seal_key`, in order."""
    stem = snapshot_group(seal_key).removesuffix(".jsonl")
    return sorted(obj["Key"] for obj in list_keys(s3, layout.bucket, f"{layout.snapshots_prefix}{stem}p"))


def with_snapshot_parts(s3, layout: SourceLayout, change_files: list[str]) -> list[str]:
    """The change files, each snapshot's seal followed by its parts: what a merge reads."""
    expanded = []
    for key in change_files:
        expanded.append(key)
        if parse_change_file_name(key)[1] == SNAPSHOT_KIND:
            expanded += part_keys(s3, layout, key)
    return expanded


def pending_snapshot(s3, layout: SourceLayout) -> str | None:
    """The newest sealed snapshot not yet merged, if any (so a failed merge does not rescan)."""
    snapshots = [key for key in list_change_files(s3, layout) if parse_change_file_name(key)[1] == SNAPSHOT_KIND]
    return snapshots[-1] if snapshots else None


def scan_table(dynamodb, table_name: str) -> Iterator[dict]:
    """Every item, consistently read, page by page."""
    for page in dynamodb.get_paginator("scan").paginate(TableName=table_name, ConsistentRead=True):
        yield from page.get("Items", [])


def delete_unsealed_parts(s3, layout: SourceLayout) -> int:
    """Deletes the parts of earlier bootstraps that failed before their seal (a sealed snapshot's parts stay)."""
    sealed = {snapshot_group(key) for key in list_change_files(s3, layout) if parse_change_file_name(key)[1] == SNAPSHOT_KIND}
    orphans = [obj["Key"] for obj in list_keys(s3, layout.bucket, layout.snapshots_prefix) if snapshot_group(obj["Key"]) not in sealed]
    for key in orphans:
        s3.delete_object(Bucket=layout.bucket, Key=key)
    return len(orphans)


def bootstrap_snapshot(
    dynamodb,
    s3,
    table_name: str,
    key_attributes: tuple[str, ...],
    layout: SourceLayout,
    namer: ChangeFileNamer,
    part_bytes: int = DEFAULT_PART_BYTES,
    stream_position: str = "0",
    on_progress: Callable[[], None] = lambda: None,
) -> BootstrapResult:
    """Scans the table into parts, then seals the snapshot; returns the seal's key, the parts and the item count. Its
    rows, and its seal, carry `stream_position`: the newest stream sequence number before the scan started.
    `on_progress` is called every PROGRESS_ITEMS items (the writer's lease sees a long scan make progress)."""
    name = namer.next_name(SNAPSHOT_KIND)  # taken before the scan starts: see the module docstring
    stem = name.removesuffix(".jsonl")
    scanned_at = datetime.now(UTC)
    parts: list[str] = []
    buffer, items = io.BytesIO(), 0

    def write_part() -> None:
        key = f"{layout.snapshots_prefix}{stem}p{len(parts) + 1:05d}.jsonl"
        s3.put_object(Bucket=layout.bucket, Key=key, Body=buffer.getvalue(), IfNoneMatch="*", ContentType="application/x-ndjson")
        parts.append(key)
        buffer.seek(0)
        buffer.truncate()

    for item in scan_table(dynamodb, table_name):
        buffer.write(snapshot_record(item, key_attributes, scanned_at, stream_position).to_json().encode("utf-8") + b"\n")
        items += 1
        if items % PROGRESS_ITEMS == 0:
            on_progress()
        if buffer.tell() >= part_bytes:
            write_part()
    if buffer.tell() or not parts:
        write_part()  # an empty table still has one (empty) part: the snapshot says "no items"
    seal = layout.changes_prefix + name
    s3.put_object(
        Bucket=layout.bucket, Key=seal, Body=b"", IfNoneMatch="*", ContentType="application/x-ndjson", Metadata={STREAM_POSITION_METADATA: stream_position}
    )
    return BootstrapResult(change_file=seal, parts=parts, items=items)


def snapshot_position(s3, layout: SourceLayout, seal_key: str) -> str | None:
    """The stream's end before the scan of the snapshot sealed by `seal_key`; None for a seal written without it."""
    return s3.head_object(Bucket=layout.bucket, Key=seal_key).get("Metadata", {}).get(STREAM_POSITION_METADATA)
