"""Building change files by hand and reading library.books back, for the merge tests."""

import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ddb_athena.lake.change_merge import MergeResult, merge_change_files
from ddb_athena.lake.writer_branch import WriterBranch
from ddb_athena.lib.declarations import declared
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.change_files import ChangeRecord, change_file_name, list_change_files, write_change_file
from ddb_athena.streamed.capture.quarantine import quarantined_records

T0 = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)


def change(sequence: int, book_id: str, event: str = "MODIFY", name: str | None = None, **attributes) -> ChangeRecord:
    image = None
    if event != "REMOVE":
        image = {"id": {"S": book_id}, "name": {"S": name or f"{book_id}@{sequence}"}, **attributes}
    return ChangeRecord(event, {"id": {"S": book_id}}, image, str(sequence), "2026-11-22T03:00:00.000000Z", "shard-0")


def plant_file(spark, table: str, name: str, age_days: float = 0) -> Path:
    """A file in the table's data folder that no snapshot references (as a crashed writer leaves), `age_days` old."""
    location = spark.sql(f"DESCRIBE TABLE EXTENDED {table}").where("col_name = 'Location'").collect()[0]["data_type"]
    stray = Path(location.removeprefix("file:")) / "data" / name
    stray.write_bytes(b"PAR1")
    modified = time.time() - age_days * 86400
    os.utime(stray, (modified, modified))
    return stray


class ChangeFiles:
    """Writes change files named at chosen capture times, and merges them into a test table."""

    def __init__(self, spark, settings):
        self.spark = spark
        self.s3 = settings.client("s3")
        self.layout = SourceLayout(settings.bucket, "books_source")
        self.table = f"{settings.namespace}.books"
        self.minute = 0

    def write(self, *records: ChangeRecord, at: datetime | None = None, kind: str = "stream") -> str:
        self.minute += 1
        return write_change_file(self.s3, self.layout, change_file_name(at or T0 + timedelta(minutes=self.minute), kind), records)

    def write_raw(self, text: str, at: datetime | None = None) -> str:
        self.minute += 1
        key = self.layout.changes_prefix + change_file_name(at or T0 + timedelta(minutes=self.minute), "stream")
        self.s3.put_object(Bucket=self.layout.bucket, Key=key, Body=text.encode())
        return key

    def present(self) -> list[str]:
        return list_change_files(self.s3, self.layout)

    def merge(self, keys: list[str] | None = None, writer: WriterBranch | None = None) -> MergeResult:
        keys = self.present() if keys is None else keys
        uris = [self.layout.uri(key, "s3a") for key in keys]
        quarantine = self.layout.uri(self.layout.quarantine_prefix + f"batch-{self.minute}", "s3a")
        return merge_change_files(self.spark, declared("books").spec, self.table, uris, quarantine, writer=writer)

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            self.s3.delete_object(Bucket=self.layout.bucket, Key=key)

    def rows(self) -> dict[str, dict]:
        return {row["id"]: row.asDict() for row in self.spark.table(self.table).collect()}

    def names(self) -> dict[str, str]:
        return {book_id: row["name"] for book_id, row in self.rows().items()}

    def quarantined(self) -> list[dict]:
        return quarantined_records(self.s3, self.layout)
