"""Foreign files in the change prefix are moved to quarantine byte for byte, with their reason; records are read back."""

import json

from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import change_file_name, list_change_files
from ddb_athena.streamed.capture.quarantine import FOREIGN_FILE_REASON, quarantine_foreign_files, quarantined_reasons, quarantined_records
from ddb_athena_tests.lake.helpers import T0


def test_files_that_are_not_change_files_move_to_quarantine_with_their_reason_and_nothing_else_moves(settings):
    s3, layout = settings.client("s3"), SourceLayout(settings.bucket, "books_source")
    change_file = layout.changes_prefix + change_file_name(T0, "stream")
    foreign = {
        layout.changes_prefix + "firehose-1-2026-11-23-00-01-02-abc": b'{"eventName": "INSERT"}\n',
        # A JSON file with another shape: its lines must not be taken for quarantine records.
        layout.changes_prefix + "manual/upload.json": b'{"reason": "not ours"}\n',
        layout.changes_prefix + "binary.gz": bytes(range(256)),
    }
    s3.put_object(Bucket=settings.bucket, Key=change_file, Body=b"{}\n")
    s3.put_object(Bucket=settings.bucket, Key=layout.changes_prefix + "empty-folder/", Body=b"")  # the console's folder
    for key, body in foreign.items():
        s3.put_object(Bucket=settings.bucket, Key=key, Body=body)

    records = quarantine_foreign_files(s3, layout, "run-1")
    assert sorted(record.source_file for record in records) == sorted(layout.uri(key) for key in foreign)
    assert {record.reason for record in records} == {FOREIGN_FILE_REASON}
    for record in records:
        original = record.source_file.split(f"{settings.bucket}/", 1)[1]
        moved = record.quarantined_file.split(f"{settings.bucket}/", 1)[1]
        assert moved == f"{layout.quarantine_prefix}run-1/files/{original[len(layout.changes_prefix) :]}"
        assert s3.get_object(Bucket=settings.bucket, Key=moved)["Body"].read() == foreign[original]
        assert record.size_bytes == len(foreign[original])
    remaining = {obj["Key"] for obj in s3.list_objects_v2(Bucket=settings.bucket, Prefix=layout.changes_prefix)["Contents"]}
    assert remaining == {change_file, layout.changes_prefix + "empty-folder/"}
    assert list_change_files(s3, layout) == [change_file]

    assert quarantined_reasons(s3, layout) == {FOREIGN_FILE_REASON: 3}
    assert {record["source_file"] for record in quarantined_records(s3, layout)} == {layout.uri(key) for key in foreign}
    assert "YYYYMMDDTHHMMSS.ffffffZ" in FOREIGN_FILE_REASON
    # Nothing foreign left: nothing moves, no record is written.
    assert quarantine_foreign_files(s3, layout, "run-2") == []
    assert len(quarantined_records(s3, layout)) == 3


def test_records_of_bad_lines_and_of_foreign_files_are_counted_together(settings):
    s3, layout = settings.client("s3"), SourceLayout(settings.bucket, "books_source")
    bad_lines = [{"source_file": "s3://b/k", "line": "x", "reason": "not valid JSON"}] * 2
    s3.put_object(
        Bucket=settings.bucket,
        Key=f"{layout.quarantine_prefix}run-0/part-00000-c000.json",
        Body="".join(json.dumps(record) + "\n" for record in bad_lines).encode(),
    )
    s3.put_object(Bucket=settings.bucket, Key=layout.changes_prefix + "stray.txt", Body=b"x")
    quarantine_foreign_files(s3, layout, "run-1")
    assert quarantined_reasons(s3, layout) == {"not valid JSON": 2, FOREIGN_FILE_REASON: 1}
