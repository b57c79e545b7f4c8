"""Bootstrap: a full scan of the table, written as one snapshot change file.

The snapshot file is named at the scan's start. The merge treats it as the whole table as of
that moment: files named before it are superseded by it, and every stream change captured
after it (including those made during the scan, replayed from the checkpoint) is applied on
top in stream order. Replaying a change the scan already saw is harmless because every later
change of the same key is replayed after it.
"""

from dataclasses import dataclass
from datetime import datetime, timezone

from ddb_athena.capture.change_files import (
    SNAPSHOT_KIND,
    ChangeFileNamer,
    SourceLayout,
    list_change_files,
    parse_change_file_name,
    snapshot_record,
    write_change_file,
)


@dataclass(frozen=True)
class BootstrapResult:
    change_file: str
    items: int


def pending_snapshot(s3, layout: SourceLayout) -> str | None:
    """The newest snapshot file not yet merged, if any (so a failed merge does not rescan)."""
    snapshots = [key for key in list_change_files(s3, layout) if parse_change_file_name(key)[1] == SNAPSHOT_KIND]
    return snapshots[-1] if snapshots else None


def scan_table(dynamodb, table_name: str):
    """Every item, consistently read, page by page."""
    for page in dynamodb.get_paginator("scan").paginate(TableName=table_name, ConsistentRead=True):
        yield from page.get("Items", [])


def bootstrap_snapshot(dynamodb, s3, table_name: str, key_attribute: str, layout: SourceLayout, namer: ChangeFileNamer) -> BootstrapResult:
    name = namer.next_name(SNAPSHOT_KIND)  # taken before the scan starts: see the module docstring
    scanned_at = datetime.now(timezone.utc)
    records = [snapshot_record(item, key_attribute, scanned_at) for item in scan_table(dynamodb, table_name)]
    key = write_change_file(s3, layout, name, records)
    return BootstrapResult(change_file=key, items=len(records))
