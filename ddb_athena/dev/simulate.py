"""Realistic traffic for demos and benchmarks: book inserts, updates, deletes, re-inserts, and orders; and the same
for any declared table with seed items (ddb_athena/dev/seeds/<name>.json), whatever its key."""

import base64
import json
import random
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from functools import cached_property
from pathlib import Path

from boto3.dynamodb.types import Binary, TypeDeserializer, TypeSerializer

from ddb_athena.lib.declarations import TableDeclaration

_WORDS = ["river", "stone", "night", "garden", "glass", "winter", "letter", "harbor", "silver", "shadow", "orchard", "lantern", "empire", "voyage"]
_AUTHORS = ["Ada Okafor", "Lin Wei", "Maria Santos", "Jonas Berg", "Priya Nair", "Tomasz Nowak", "Aiko Tanaka"]
_serializer = TypeSerializer()
_deserializer = TypeDeserializer()
SEEDS = Path(__file__).resolve().parent / "seeds"
# Of the steps of a table that has seeded tables beside it, the share that goes to them.
SEEDED_SHARE = 0.3


def _ddb(item: dict) -> dict:
    return {name: _serializer.serialize(value) for name, value in item.items()}


def summary(rng: random.Random, words: int, at_least_bytes: int = 0) -> str:
    """Random words, at least `at_least_bytes` long (load tests size their items with it)."""
    text = " ".join(rng.choices(_WORDS, k=words))
    while len(text) < at_least_bytes:
        text += " " + " ".join(rng.choices(_WORDS, k=words))
    return text


def book_item(book_id: str, rng: random.Random, summary_bytes: int = 0) -> dict:
    """A book with every DynamoDB type in it (S, N, B, BOOL, NULL, M, L, SS, NS, BS)."""
    published = datetime(1950, 1, 1, tzinfo=UTC).timestamp() + rng.randrange(0, 2_300_000_000)
    return _ddb(
        {
            "id": book_id,
            "name": " ".join(rng.sample(_WORDS, 3)).title(),
            "author": rng.choice(_AUTHORS),
            "summary": summary(rng, 12, summary_bytes),
            "date": int(published) * 1_000_000_000 + rng.randrange(1_000_000_000),
            "price": Decimal(rng.randrange(100, 10_000)) / 100,
            "in_print": rng.random() < 0.8,
            "isbn_check": None,
            "tags": set(rng.sample(_WORDS, 2)),
            "ratings": {Decimal(rng.randrange(1, 6)), Decimal("4.5")},
            "cover_thumbnail": rng.randbytes(8),
            "fingerprints": {rng.randbytes(4), rng.randbytes(4)},
            "editions": [{"year": rng.randrange(1950, 2026), "format": rng.choice(["hardcover", "paperback"])}],
            "publisher": {"name": rng.choice(_WORDS).title() + " Press", "country": "NO"},
        }
    )


def order_item(rng: random.Random, created_at: datetime) -> dict:
    lines = [{"sku": f"sku-{rng.randrange(1000)}", "qty": rng.randrange(1, 4)} for _ in range(rng.randrange(1, 4))]
    return _ddb(
        {
            "order_id": str(uuid.UUID(int=rng.getrandbits(128))),
            "customer_id": f"customer-{rng.randrange(10_000)}",
            "amount": Decimal(rng.randrange(100, 100_000)) / 100,
            "currency": rng.choice(["EUR", "USD", "NOK"]),
            "created_at": created_at.isoformat().replace("+00:00", "Z"),
            "items": lines,
            "paid": rng.random() < 0.9,
        }
    )


def next_action(roll: float, live: list, deleted: list) -> str:
    """The mix of every table's traffic: 40% inserts, 35% updates, 17% deletes, 8% re-inserts of a deleted key."""
    if not live or roll < 0.4:
        return "insert"
    if roll < 0.75:
        return "update"
    if roll < 0.92 or not deleted:
        return "delete"
    return "reinsert"


def plain(value: dict):
    """A DynamoDB JSON value as Python (B as bytes, not boto3's Binary wrapper)."""
    value = _deserializer.deserialize(value)
    return value.value if isinstance(value, Binary) else value


def seed_items(name: str) -> list[dict] | None:
    """The seed items of a declared table (plain JSON; numbers exact, base64 {"B": ...} for binary), or None."""
    path = SEEDS / f"{name}.json"
    if not path.exists():
        return None
    items = json.loads(path.read_text(), parse_float=Decimal, parse_int=Decimal)
    return [{name: _binary_or_plain(value) for name, value in item.items()} for item in items]


def _binary_or_plain(value):
    return base64.b64decode(value["B"]) if isinstance(value, dict) and set(value) == {"B"} else value


@dataclass
class SeededTraffic:
    """Inserts, updates, deletes and re-inserts on a declared table, made from its seed items, whatever its key: a new
    item mixes the seed items' attribute values under a fresh key (its sort key new, its partition key mostly one
    already written, so a partition holds several items); an update sets an attribute other than the key to another
    seed value."""

    dynamodb: object
    table: TableDeclaration
    table_name: str
    seeds: list[dict]
    rng: random.Random
    live: list[dict] = field(default_factory=list)
    deleted: list[dict] = field(default_factory=list)

    @cached_property
    def seed_values(self) -> dict[str, list]:
        """Each attribute of the seed items (the key's left out) and the values the seeds give it."""
        keys = {column.attribute for column in self.table.spec.key_columns}
        names = sorted({name for item in self.seeds for name in item} - keys)
        return {name: [seed[name] for seed in self.seeds if name in seed] for name in names}

    def key_of(self, item: dict) -> dict:
        return {column.attribute: item[column.attribute] for column in self.table.spec.key_columns}

    def fresh(self, type_tag: str, attribute: str):
        token = self.rng.getrandbits(48)
        return {"S": f"{attribute}-{token:012x}", "N": Decimal(token), "B": token.to_bytes(6, "big")}[type_tag]

    def put(self, item: dict) -> None:
        self.dynamodb.put_item(TableName=self.table_name, Item=_ddb(item))
        self.live.append(self.key_of(item))

    def seed(self) -> int:
        for item in self.seeds:
            self.put(item)
        return len(self.seeds)

    def load_existing_keys(self) -> None:
        attributes = [column.attribute for column in self.table.spec.key_columns]
        names = {f"#k{index}": attribute for index, attribute in enumerate(attributes)}
        pages = self.dynamodb.get_paginator("scan").paginate(TableName=self.table_name, ProjectionExpression=", ".join(names), ExpressionAttributeNames=names)
        self.live.extend({name: plain(value) for name, value in item.items()} for page in pages for item in page.get("Items", []))

    def new_item(self, key: dict | None = None) -> dict:
        item = {name: self.rng.choice(values) for name, values in self.seed_values.items()}
        if key is None:
            partition, *sort = self.table.spec.key_columns
            key = {column.attribute: self.fresh(column.type_tag, column.attribute) for column in sort}
            if self.live and sort and self.rng.random() < 0.7:
                key[partition.attribute] = self.rng.choice(self.live)[partition.attribute]
            else:
                key[partition.attribute] = self.fresh(partition.type_tag, partition.attribute)
        return {**item, **key}

    def step(self) -> str:
        action = next_action(self.rng.random(), self.live, self.deleted)
        if action == "insert":
            self.put(self.new_item())
        elif action == "update":
            attribute = self.rng.choice(list(self.seed_values))
            value = self.rng.choice(self.seed_values[attribute])
            self.dynamodb.update_item(
                TableName=self.table_name,
                Key=_ddb(self.rng.choice(self.live)),
                UpdateExpression="SET #a = :v",
                ExpressionAttributeNames={"#a": attribute},
                ExpressionAttributeValues={":v": _serializer.serialize(value)},
            )
        elif action == "delete":
            key = self.live.pop(self.rng.randrange(len(self.live)))
            self.dynamodb.delete_item(TableName=self.table_name, Key=_ddb(key))
            self.deleted.append(key)
        else:
            self.put(self.new_item(self.deleted.pop(self.rng.randrange(len(self.deleted)))))
        return action


@dataclass
class BookSimulator:
    """Keeps track of live and deleted ids so updates, deletes and re-inserts hit real items."""

    dynamodb: object
    books_table: str
    orders_table: str | None = None
    rng: random.Random = field(default_factory=random.Random)
    summary_bytes: int = 0
    # Declared tables written beside books, a SEEDED_SHARE of the steps (make dev: every table with seed items).
    seeded: list[SeededTraffic] = field(default_factory=list)
    live: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"insert": 0, "update": 0, "delete": 0, "reinsert": 0, "order": 0})

    def load_existing_ids(self) -> None:
        for page in self.dynamodb.get_paginator("scan").paginate(TableName=self.books_table, ProjectionExpression="id"):
            self.live.extend(item["id"]["S"] for item in page.get("Items", []))

    def insert(self, book_id: str | None = None) -> None:
        book_id = book_id or f"book-{uuid.UUID(int=self.rng.getrandbits(128)).hex[:12]}"
        self.dynamodb.put_item(TableName=self.books_table, Item=book_item(book_id, self.rng, self.summary_bytes))
        self.live.append(book_id)

    def step(self) -> str:
        if self.seeded and self.rng.random() < SEEDED_SHARE:
            traffic = self.rng.choice(self.seeded)
            action = f"{traffic.table.name}.{traffic.step()}"
            self.counts[action] = self.counts.get(action, 0) + 1
            return action
        roll = self.rng.random()
        action = "order" if self.orders_table and roll < 0.1 else next_action(roll, self.live, self.deleted)
        if action == "order":
            self.dynamodb.put_item(TableName=self.orders_table, Item=order_item(self.rng, datetime.now(UTC)))
        elif action == "insert":
            self.insert()
        elif action == "update":
            book_id = self.rng.choice(self.live)
            self.dynamodb.update_item(
                TableName=self.books_table,
                Key={"id": {"S": book_id}},
                UpdateExpression="SET summary = :s, price = :p",
                ExpressionAttributeValues={":s": {"S": summary(self.rng, 10, self.summary_bytes)}, ":p": {"N": str(self.rng.randrange(1, 10_000))}},
            )
        elif action == "delete":
            book_id = self.live.pop(self.rng.randrange(len(self.live)))
            self.dynamodb.delete_item(TableName=self.books_table, Key={"id": {"S": book_id}})
            self.deleted.append(book_id)
        else:
            self.insert(self.deleted.pop(self.rng.randrange(len(self.deleted))))
        self.counts[action] += 1
        return action

    def run(self, rate: float, duration: float | None, should_stop=lambda: False, operations: int | None = None) -> dict[str, int]:
        """`rate` operations per second for `duration` seconds, or until `operations` were written (None: until stopped)."""
        interval = 1.0 / rate
        started = time.monotonic()
        next_at = started
        written = 0
        while (duration is None or time.monotonic() - started < duration) and (operations is None or written < operations) and not should_stop():
            self.step()
            written += 1
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
        return self.counts
