"""What a reader sees of each table's `main`, held against what was written: PyIceberg reads the table from its
metadata every few seconds (as Athena does, not the project's Spark) and every key's history is checked.

- A key moves backwards when a read shows it at a version lower than one a read showed before, or a deleted key comes
  back with a version older than its delete.
- A key vanishes when a read no longer shows it and no delete of it was acknowledged after the version last seen.
- A key is duplicated when a read shows two rows of it.
- A read fails on a missing data, delete or manifest file of the snapshot it opened (Athena's HIVE_CANNOT_OPEN_SPLIT):
  only expiry deletes them, and never a retained snapshot's. A missing version hint or metadata file is the local
  catalog's instant mid-commit: counted, read again.
At the end (the load stopped, the stack quiet) the table must equal DynamoDB: every key present in both or in neither,
each of the load's keys at DynamoDB's version. Between reads, the freshest write each read shows tells when the sync
caught up again after a fault (its recovery).
"""

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ddb_athena.lib.declarations import TableDeclaration
from ddb_athena_faults.versioned_writes import VERSION_ATTRIBUTE, Key, KeyLog, key_of

MOVED_BACKWARDS = "key moved backwards"
OLDER_AFTER_DELETE = "deleted key came back older"
VANISHED = "key vanished without a delete"
DUPLICATED = "duplicate rows of a key"
LOST = "lost at the end (DynamoDB has it, or a newer version)"
RESURRECTED = "extra at the end (only in Iceberg)"
DUPLICATED_AT_END = "duplicate rows at the end"
UNREADABLE = "a file the snapshot names is missing"


@dataclass(frozen=True)
class Anomaly:
    kind: str
    table: str
    key: Key
    detail: str


@dataclass
class KeyView:
    """What reads have shown of a key so far: the lowest version a read may show now."""

    floor: int = 0
    present: bool = False


@dataclass(frozen=True)
class Read:
    at: float
    # Per table: the acknowledgement time of the freshest write the read shows (None: none of the load's yet).
    freshest: dict[str, float | None]


def read_rows(table_dir: Path) -> list[dict]:
    """Every row's item (DynamoDB JSON) of the table's current snapshot of `main`."""
    from pyiceberg.table import StaticTable

    table = StaticTable.from_metadata(str(table_dir))
    return [json.loads(item) for item in table.scan(selected_fields=("item",)).to_arrow().column("item").to_pylist()]


# What a failed read could not open, told by the file its error names. The version hint is missing for an instant at
# each commit of the local (Hadoop) catalog, which deletes it before it renames the new one in; Glue's pointer, which
# Athena reads, has no such gap.
_MISSING_FILE_KINDS = (
    ("version-hint.text", "the version hint"),
    (".metadata.json", "a metadata file"),
    (".avro", "a manifest"),
    (".parquet", "a data or delete file"),
)
# A reader must never miss these: they are the snapshot's own, kept while it is retained.
_SNAPSHOT_FILE_KINDS = ("a manifest", "a data or delete file")


def missing_file_kind(error: Exception) -> str | None:
    """For a file not found, which of the table's files it was."""
    return next((kind for marker, kind in _MISSING_FILE_KINDS if marker in str(error)), None) if isinstance(error, FileNotFoundError) else None


def read_error(error: Exception) -> str:
    """`error`'s class, and for a file not found which of the table's files it was."""
    missing = missing_file_kind(error)
    return f"{type(error).__name__} of {missing}" if missing else type(error).__name__


def rows_by_key(table: TableDeclaration, items: list[dict]) -> tuple[dict[Key, dict], Counter]:
    counts = Counter(key_of(table, item) for item in items)
    return {key_of(table, item): item for item in items}, counts


def version_of(item: dict) -> int | None:
    attribute = item.get(VERSION_ATTRIBUTE)
    return int(attribute["N"]) if attribute else None


@dataclass
class Checker:
    tables: dict[str, TableDeclaration]
    table_dirs: dict[str, Path]
    writes: Callable[[], dict[str, dict[Key, KeyLog]]]
    clock: Callable[[], float] = time.monotonic
    views: dict[str, dict[Key, KeyView]] = field(default_factory=dict)
    anomalies: list[Anomaly] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    read_errors: Counter = field(default_factory=Counter)

    def poll(self) -> None:
        """One read of every table, checked. A table not yet created, or a metadata file mid-write, is read again next time."""
        freshest = {}
        for name, table in self.tables.items():
            try:
                items = read_rows(self.table_dirs[name])
            except Exception as error:  # noqa: BLE001 - counted and reported; the next poll reads again
                self.read_errors[f"{name}: {read_error(error)}"] += 1
                if missing_file_kind(error) in _SNAPSHOT_FILE_KINDS:
                    self._flag(UNREADABLE, name, (), str(error)[:300])
                return
            # The writes acknowledged before the read: anything the read shows was written by then.
            freshest[name] = self.observe(name, table, items, self.writes()[name])
        self.reads.append(Read(self.clock(), freshest))

    def observe(self, name: str, table: TableDeclaration, items: list[dict], logs: dict[Key, KeyLog]) -> float | None:
        rows, counts = rows_by_key(table, items)
        views = self.views.setdefault(name, {})
        freshest = None
        for key, count in counts.items():
            if count > 1:
                self._flag(DUPLICATED, name, key, f"{count} rows in one read")
        for key, log in logs.items():
            view = views.setdefault(key, KeyView())
            item = rows.get(key)
            if item is not None:
                version = version_of(item)
                if version is None:
                    continue  # a row of before the load's first write of the key
                if version < view.floor:
                    kind = MOVED_BACKWARDS if view.present else OLDER_AFTER_DELETE
                    self._flag(kind, name, key, f"read version {version} after having read {'version' if view.present else 'its delete at'} {view.floor}")
                view.floor, view.present = max(view.floor, version), True
                written = log.written(version)
                if written is not None:
                    freshest = max(freshest or written, written)
            elif view.present:
                deleted_at = log.first_delete_after(view.floor)
                if deleted_at is None:
                    self._flag(VANISHED, name, key, f"absent after version {view.floor}, no delete acknowledged since")
                else:
                    view.floor, view.present = deleted_at, False
        return freshest

    def _flag(self, kind: str, table: str, key: Key, detail: str) -> None:
        self.anomalies.append(Anomaly(kind, table, key, detail))

    def differences(self, name: str, dynamodb_items: list[dict], iceberg_items: list[dict]) -> list[Anomaly]:
        """How the table differs from DynamoDB (both read once the stack is quiet): every key, the load's and others."""
        table = self.tables[name]
        expected, _ = rows_by_key(table, dynamodb_items)
        found, counts = rows_by_key(table, iceberg_items)
        differences = [Anomaly(DUPLICATED_AT_END, name, key, f"{count} rows") for key, count in counts.items() if count > 1]
        for key, item in expected.items():
            if key not in found:
                differences.append(Anomaly(LOST, name, key, "missing from Iceberg"))
            elif version_of(found[key]) != version_of(item):
                differences.append(Anomaly(LOST, name, key, f"Iceberg at version {version_of(found[key])}, DynamoDB at {version_of(item)}"))
        differences += [Anomaly(RESURRECTED, name, key, "not in DynamoDB") for key in found.keys() - expected.keys()]
        return differences

    def caught_up_after(self, moment: float) -> float | None:
        """When reads first showed, in every table, a write acknowledged after `moment` (None: not yet)."""
        for read in self.reads:
            if read.at >= moment and all(written is not None and written >= moment for written in read.freshest.values()):
                return read.at
        return None
