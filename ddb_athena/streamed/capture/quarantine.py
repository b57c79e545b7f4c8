"""The quarantine of a source: what the sync could not apply, each with its reason, until someone deals with it.

`<prefix>/quarantine/<batch>/` holds a batch's records: JSON Lines files (`source_file`, `reason`,
`line`; the loads write one per bad line). A file in the change prefix whose name is not a change
file name (another producer, a manual upload, a renamed file) is moved to `<batch>/files/`, byte
for byte, with one record naming it and the reason.
"""

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import CHANGE_FILE_NAME_FORMAT, is_change_file, list_keys

FOREIGN_FILE_REASON = f"not a change file: its name does not match {CHANGE_FILE_NAME_FORMAT}, so it was never merged"
_RECORDS_NAME = "foreign-files.json"
_MOVED_FILES = "files"


@dataclass(frozen=True)
class QuarantineRecord:
    source_file: str
    reason: str
    line: str | None = None
    quarantined_file: str | None = None
    size_bytes: int | None = None


def _is_folder_marker(obj: dict) -> bool:
    # What the S3 console's "Create folder" writes: no content, nothing to lose.
    return obj["Key"].endswith("/") and obj["Size"] == 0


def quarantine_foreign_files(s3, layout: SourceLayout, batch: str, listed: Iterable[dict] | None = None) -> list[QuarantineRecord]:
    """Moves every object in the change prefix (`listed`, as the caller listed it; else listed here) that is not a
    change file into the batch's quarantine; returns their records. The copy and its record are written before the
    original is deleted: nothing is lost."""
    listed = list_keys(s3, layout.bucket, layout.changes_prefix) if listed is None else listed
    foreign = [obj for obj in listed if not is_change_file(obj["Key"]) and not _is_folder_marker(obj)]
    if not foreign:
        return []
    folder = f"{layout.quarantine_prefix}{batch}/"
    records = []
    for obj in foreign:
        target = f"{folder}{_MOVED_FILES}/{obj['Key'][len(layout.changes_prefix) :]}"
        # The managed copy: multipart above 5 GB, where a single CopyObject would fail.
        s3.copy({"Bucket": layout.bucket, "Key": obj["Key"]}, layout.bucket, target)
        records.append(QuarantineRecord(layout.uri(obj["Key"]), FOREIGN_FILE_REASON, None, layout.uri(target), obj["Size"]))
    body = "".join(json.dumps(asdict(record)) + "\n" for record in records).encode("utf-8")
    s3.put_object(Bucket=layout.bucket, Key=folder + _RECORDS_NAME, Body=body, ContentType="application/x-ndjson")
    for obj in foreign:
        s3.delete_object(Bucket=layout.bucket, Key=obj["Key"])
    return records


def quarantined_records(s3, layout: SourceLayout) -> list[dict]:
    """Every quarantine record of the source (the files moved under a batch's `files/` are not records)."""
    records = []
    for obj in list_keys(s3, layout.bucket, layout.quarantine_prefix):
        batch_path = obj["Key"][len(layout.quarantine_prefix) :]
        if batch_path.endswith(".json") and f"/{_MOVED_FILES}/" not in f"/{batch_path}":
            body = s3.get_object(Bucket=layout.bucket, Key=obj["Key"])["Body"].read().decode("utf-8")
            records += [json.loads(line) for line in body.splitlines() if line.strip()]
    return records


def quarantined_reasons(s3, layout: SourceLayout) -> dict[str, int]:
    """How many quarantined records there are, by reason."""
    reasons: dict[str, int] = {}
    for record in quarantined_records(s3, layout):
        reason = record.get("reason", "unknown")
        reasons[reason] = reasons.get(reason, 0) + 1
    return reasons
