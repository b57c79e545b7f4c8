"""The harness's load: puts, updates, deletes and re-inserts of a few dozen keys of each table, every write of a key one
`version` higher than the one before (a delete takes a version too), logged with when DynamoDB acknowledged it. The
checker holds what readers see against this log. Writes go straight to the emulator, never through the fault proxy:
the load is the user's application, not the sync.
"""

import random
import threading
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ddb_athena.lib.declarations import TableDeclaration

VERSION_ATTRIBUTE = "version"
# Deletes among the writes of a live key (the rest are updates); a deleted key's next write re-inserts it.
DELETE_SHARE = 0.2

Key = tuple[str, ...]


@dataclass
class KeyLog:
    """One key's writes in order: version, whether it was a delete, when DynamoDB acknowledged it (monotonic)."""

    versions: list[int] = field(default_factory=list)
    deleted: list[bool] = field(default_factory=list)
    written_at: list[float] = field(default_factory=list)

    @property
    def last_version(self) -> int:
        return self.versions[-1] if self.versions else 0

    @property
    def live(self) -> bool:
        return bool(self.versions) and not self.deleted[-1]

    def written(self, version: int) -> float | None:
        index = bisect_right(self.versions, version) - 1
        return self.written_at[index] if index >= 0 and self.versions[index] == version else None

    def first_delete_after(self, version: int) -> int | None:
        index = bisect_right(self.versions, version)
        return next((self.versions[i] for i in range(index, len(self.versions)) if self.deleted[i]), None)


def key_of(table: TableDeclaration, wire_item: dict) -> Key:
    """An item's key as text, from DynamoDB JSON (a scan's item, or an Iceberg row's `item` column)."""
    return tuple(next(iter(wire_item[column.attribute].values())) for column in table.spec.key_columns)


def _attributes(table_name: str, key_number: int, version: int) -> dict:
    if table_name == "reviews":
        return {
            "book_id": {"S": f"fault-book-{key_number // 4:03d}"},
            "review_id": {"N": str(key_number % 4 + 1)},
            "stars": {"N": str(1 + version % 5)},
            "reviewer": {"S": "fault harness"},
            "body": {"S": f"review version {version}"},
            "reviewed_at": {"S": datetime.now(UTC).isoformat().replace("+00:00", "Z")},
        }
    return {"id": {"S": f"fault-{key_number:03d}"}, "name": {"S": f"book version {version}"}, "author": {"S": "fault harness"}}


class VersionedWriter:
    """Writes `rate` operations a second over `keys` keys of each table (round robin between tables) from a thread."""

    def __init__(self, dynamodb, tables: dict[str, TableDeclaration], dynamodb_names: dict[str, str], rate: float, keys: int, seed: int):
        self._dynamodb, self.tables, self._names = dynamodb, tables, dynamodb_names
        self._rate, self._keys, self._rng = rate, keys, random.Random(seed)
        self.logs: dict[str, dict[Key, KeyLog]] = {name: {} for name in tables}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failed_writes = 0

    def snapshot(self) -> dict[str, dict[Key, KeyLog]]:
        """The logs as they are now (a reader's view is judged against the writes acknowledged before it was read)."""
        with self._lock:
            return {
                name: {key: KeyLog(list(log.versions), list(log.deleted), list(log.written_at)) for key, log in logs.items()}
                for name, logs in self.logs.items()
            }

    def write_once(self, table_name: str, clock: Callable[[], float] = time.monotonic) -> None:
        table = self.tables[table_name]
        number = self._rng.randrange(self._keys)
        item = _attributes(table_name, number, 0)
        key = key_of(table, item)
        with self._lock:
            log = self.logs[table_name].setdefault(key, KeyLog())
            version = log.last_version + 1
        delete = log.live and self._rng.random() < DELETE_SHARE
        key_item = {column.attribute: item[column.attribute] for column in table.spec.key_columns}
        try:
            if delete:
                self._dynamodb.delete_item(TableName=self._names[table_name], Key=key_item)
            else:
                item = {**_attributes(table_name, number, version), VERSION_ATTRIBUTE: {"N": str(version)}}
                self._dynamodb.put_item(TableName=self._names[table_name], Item=item)
        except Exception:  # noqa: BLE001 - whether it happened is unknown: read it back and log what DynamoDB holds
            self.failed_writes += 1
            stored = self._dynamodb.get_item(TableName=self._names[table_name], Key=key_item, ConsistentRead=True).get("Item")
            delete = stored is None
            if stored is not None and int(stored[VERSION_ATTRIBUTE]["N"]) != version:
                return
        with self._lock:
            log.versions.append(version)
            log.deleted.append(delete)
            log.written_at.append(clock())

    def _run(self) -> None:
        names = sorted(self.tables)
        turn = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.write_once(names[turn % len(names)])
            turn += 1
            next_at += 1 / self._rate
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="versioned-writer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
