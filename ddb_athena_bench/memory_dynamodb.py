"""One DynamoDB table and its stream, served from memory: the sync's own capacity, past what the emulator serves.

It answers the calls the simulator and a stream capture make (the dynamodb and dynamodbstreams clients' subset):
writes change the items and append a stream record at once, stamped with the wall clock; the records are spread
over `shards` open shards by key, and served up to 1,000 a page, as AWS serves them at most. Records are dropped once
served (an hour at 250 writes a second would otherwise hold ~900,000 in this process): a reader resumes after the
last record it was served, as a capture does from its checkpoint.
"""

import re
import threading
import zlib
from bisect import bisect_right
from collections.abc import Iterator, MutableMapping
from datetime import UTC, datetime

STREAM_ARN = "arn:aws:dynamodb:us-east-1:123456789012:table/{table}/stream/2026-11-25T00:00:00.000"
FIRST_SEQUENCE_NUMBER = 10**20
PAGE_LIMIT = 1000
_SET_CLAUSE = re.compile(r"(\w+)\s*=\s*(:\w+)")
# A copy's key: its original's, this, and the copy's number (`CopiedItems`).
COPY_SEPARATOR = "~"


class CopiedItems(MutableMapping):
    """A table's items and `copies - 1` more of each, keyed `<key>~<n>` (n from 1), the same but for their key. The
    copies are made as they are read, and only the writes since are held: ten million ~1 KB items do not fit this
    process, one million and an hour of changes do."""

    def __init__(self, originals: dict[str, dict], key_attribute: str, copies: int):
        self._originals, self._key_attribute, self._copies = originals, key_attribute, copies
        self._written: dict[str, dict] = {}
        # Keys of originals or copies deleted since (and not written again).
        self._deleted: set[str] = set()
        self._size = len(originals) * copies

    def _copied(self, key: str) -> dict | None:
        """The original or copy of that key as it was copied, if there is one."""
        if key in self._originals:
            return self._originals[key]
        original, separator, number = key.rpartition(COPY_SEPARATOR)
        if not separator or not number.isdigit() or not 1 <= int(number) < self._copies or original not in self._originals:
            return None
        return {**self._originals[original], self._key_attribute: {"S": key}}

    def __getitem__(self, key: str) -> dict:
        if key in self._written:
            return self._written[key]
        item = None if key in self._deleted else self._copied(key)
        if item is None:
            raise KeyError(key)
        return item

    def __setitem__(self, key: str, item: dict) -> None:
        self._size += key not in self
        self._deleted.discard(key)
        self._written[key] = item

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self._size -= 1
        self._written.pop(key, None)
        if self._copied(key) is not None:
            self._deleted.add(key)

    def __contains__(self, key: object) -> bool:
        return key in self._written or (key not in self._deleted and self._copied(key) is not None)

    def __iter__(self) -> Iterator[str]:
        for original in self._originals:
            for key in (original, *(f"{original}{COPY_SEPARATOR}{number}" for number in range(1, self._copies))):
                if key not in self._written and key not in self._deleted:
                    yield key
        yield from self._written

    def __len__(self) -> int:
        return self._size


class MemoryDynamoDB:
    def __init__(self, table_name: str, key_attribute: str = "id", shards: int = 4):
        self.table_name, self.key_attribute = table_name, key_attribute
        self.stream_arn = STREAM_ARN.format(table=table_name)
        self.items: dict[str, dict] = {}
        self._shards: list[list[dict]] = [[] for _ in range(shards)]
        # The position in its shard of each shard's first record still held.
        self._dropped = [0] * shards
        self._sequence = FIRST_SEQUENCE_NUMBER
        self._lock = threading.Lock()
        # The write time of each record served since the last take_served().
        self._served: list[datetime] = []

    # dynamodb

    def seed(self, items: list[dict]) -> None:
        """Items written before the stream was enabled: in the table, not in the stream (a bootstrap finds them)."""
        self.items.update((item[self.key_attribute]["S"], item) for item in items)

    def copy_items(self, copies: int) -> None:
        """The table holds `copies` of each item it holds now (`CopiedItems`), as one that many times larger would."""
        with self._lock:
            self.items = CopiedItems(self.items, self.key_attribute, copies)

    def describe_table(self, TableName: str) -> dict:
        self._check(TableName)
        return {
            "Table": {
                "TableName": TableName,
                "ItemCount": len(self.items),
                "StreamSpecification": {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
                "LatestStreamArn": self.stream_arn,
            }
        }

    def put_item(self, TableName: str, Item: dict) -> dict:
        self._check(TableName)
        key = Item[self.key_attribute]["S"]
        self._write(key, Item)
        return {}

    def update_item(self, TableName: str, Key: dict, UpdateExpression: str, ExpressionAttributeValues: dict) -> dict:
        """`SET a = :x, b = :y` only (what the simulator sends)."""
        self._check(TableName)
        clauses = _SET_CLAUSE.findall(UpdateExpression)
        if not UpdateExpression.strip().upper().startswith("SET") or not clauses:
            raise ValueError(f"only SET updates are served from memory, not {UpdateExpression!r}")
        key = Key[self.key_attribute]["S"]
        item = {**self.items.get(key, Key), **{name: ExpressionAttributeValues[value] for name, value in clauses}}
        self._write(key, item)
        return {}

    def delete_item(self, TableName: str, Key: dict) -> dict:
        self._check(TableName)
        key = Key[self.key_attribute]["S"]
        self._write(key, None)
        return {}

    def get_paginator(self, operation: str):
        if operation != "scan":
            raise ValueError(f"only scan pages are served from memory, not {operation}")
        return self

    def paginate(self, TableName: str, **_options):
        self._check(TableName)
        with self._lock:
            keys = list(self.items)  # the keys as the scan starts; an item deleted since is not in its page
        for start in range(0, max(len(keys), 1), PAGE_LIMIT):
            yield {"Items": [item for key in keys[start : start + PAGE_LIMIT] if (item := self.items.get(key)) is not None]}

    # dynamodbstreams

    def describe_stream(self, StreamArn: str, ExclusiveStartShardId: str | None = None) -> dict:
        shards = [
            {"ShardId": f"shard-{number}", "SequenceNumberRange": {"StartingSequenceNumber": str(FIRST_SEQUENCE_NUMBER)}} for number in range(len(self._shards))
        ]
        return {"StreamDescription": {"StreamArn": StreamArn, "Shards": shards}}

    def get_shard_iterator(self, StreamArn: str, ShardId: str, ShardIteratorType: str, SequenceNumber: str | None = None) -> dict:
        shard = int(ShardId.removeprefix("shard-"))
        with self._lock:
            if ShardIteratorType == "TRIM_HORIZON":
                return {"ShardIterator": f"{shard}:{self._dropped[shard]}"}
            numbers = [int(record["dynamodb"]["SequenceNumber"]) for record in self._shards[shard]]
            return {"ShardIterator": f"{shard}:{self._dropped[shard] + bisect_right(numbers, int(SequenceNumber))}"}

    def get_records(self, ShardIterator: str, Limit: int = PAGE_LIMIT) -> dict:
        shard, position = (int(part) for part in ShardIterator.split(":"))
        with self._lock:
            held, start = self._shards[shard], position - self._dropped[shard]
            if start < 0:
                raise ValueError(f"records before {self._dropped[shard]} of shard {shard} were dropped once served")
            records = held[start : start + min(Limit, PAGE_LIMIT)]
            del held[: start + len(records)]
            self._dropped[shard] = position + len(records)
            self._served.extend(record["dynamodb"]["ApproximateCreationDateTime"] for record in records)
        return {"Records": records, "NextShardIterator": f"{shard}:{position + len(records)}"}

    def take_served(self) -> list[datetime]:
        """The write times of the records served since the last call (a bench's freshness, cycle by cycle)."""
        with self._lock:
            served, self._served = self._served, []
        return served

    def records_waiting(self) -> int:
        """Records written and not yet served."""
        with self._lock:
            return sum(len(shard) for shard in self._shards)

    def _write(self, key: str, item: dict | None) -> None:
        with self._lock:
            existed = key in self.items
            if item is None and not existed:
                return
            if item is None:
                del self.items[key]
            else:
                self.items[key] = item
            self._sequence += 1
            event = "REMOVE" if item is None else "MODIFY" if existed else "INSERT"
            record = {
                "eventName": event,
                "dynamodb": {
                    "Keys": {self.key_attribute: {"S": key}},
                    **({"NewImage": item} if item is not None else {}),
                    "SequenceNumber": str(self._sequence),
                    "ApproximateCreationDateTime": datetime.now(UTC),
                    "StreamViewType": "NEW_AND_OLD_IMAGES",
                },
            }
            self._shards[zlib.crc32(key.encode()) % len(self._shards)].append(record)

    def _check(self, table_name: str) -> None:
        if table_name != self.table_name:
            raise ValueError(f"this memory table is {self.table_name!r}, not {table_name!r}")
