"""Realistic traffic for demos and benchmarks: book inserts, updates, deletes, re-inserts, and orders."""

import random
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

from boto3.dynamodb.types import TypeSerializer

_WORDS = ["river", "stone", "night", "garden", "glass", "winter", "letter", "harbor", "silver", "shadow", "orchard", "lantern", "empire", "voyage"]
_AUTHORS = ["Ada Okafor", "Lin Wei", "Maria Santos", "Jonas Berg", "Priya Nair", "Tomasz Nowak", "Aiko Tanaka"]
_serializer = TypeSerializer()


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


@dataclass
class BookSimulator:
    """Keeps track of live and deleted ids so updates, deletes and re-inserts hit real items."""

    dynamodb: object
    books_table: str
    orders_table: str | None = None
    rng: random.Random = field(default_factory=random.Random)
    summary_bytes: int = 0
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
        roll = self.rng.random()
        if self.orders_table and roll < 0.1:
            self.dynamodb.put_item(TableName=self.orders_table, Item=order_item(self.rng, datetime.now(UTC)))
            action = "order"
        elif not self.live or roll < 0.4:
            self.insert()
            action = "insert"
        elif roll < 0.75:
            book_id = self.rng.choice(self.live)
            self.dynamodb.update_item(
                TableName=self.books_table,
                Key={"id": {"S": book_id}},
                UpdateExpression="SET summary = :s, price = :p",
                ExpressionAttributeValues={":s": {"S": summary(self.rng, 10, self.summary_bytes)}, ":p": {"N": str(self.rng.randrange(1, 10_000))}},
            )
            action = "update"
        elif roll < 0.92 or not self.deleted:
            book_id = self.live.pop(self.rng.randrange(len(self.live)))
            self.dynamodb.delete_item(TableName=self.books_table, Key={"id": {"S": book_id}})
            self.deleted.append(book_id)
            action = "delete"
        else:
            self.insert(self.deleted.pop(self.rng.randrange(len(self.deleted))))
            action = "reinsert"
        self.counts[action] += 1
        return action

    def run(self, rate: float, duration: float | None, should_stop=lambda: False) -> dict[str, int]:
        """`rate` operations per second for `duration` seconds (None: until stopped)."""
        interval = 1.0 / rate
        started = time.monotonic()
        next_at = started
        while (duration is None or time.monotonic() - started < duration) and not should_stop():
            self.step()
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
        return self.counts
