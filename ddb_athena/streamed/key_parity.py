"""Whether an Iceberg table holds the same items as its DynamoDB table (keys and values), told apart from changes in
flight.

Under live writes the two never match at one instant: an item written after the last capture is in DynamoDB and not
yet in Iceberg (or still in Iceberg after a delete, or there with its older value). Such a key differs once and is
merged within a cycle or two. A key that still differs in the same way `settle_seconds` after it was first seen is a
real divergence (a lost change, a row deleted or edited in the table by hand): only those fail.

A look reads the table first, then DynamoDB, and compares each key's presence and the digest of its item
(`item_digest`: the whole DynamoDB item, attribute and set order aside). "The same way" includes the change the table
last merged for the key: the sequence number its row was written from (a key only in Iceberg, or with another value)
or that of its newest tombstone (a key missing from Iceberg), and the value DynamoDB held. A key deleted, inserted
again and deleted again between two looks is caught in flight at both: its row is another one, so it is a new change,
not a stuck one.

The second look at a key re-reads the table only, not DynamoDB (`ParityTracker.recheck`), so it costs no read units
and comes right after the scan whatever the scan took: one scan of a large table outlasts the settle time many times
over. It is enough: DynamoDB held the value the scan read when it read it, after the table was read (an eventually
consistent read lags a write by about a second, far less than a merge takes). If at a look `settle_seconds` after the
scan the table still holds the very row (or tombstone) it held before the scan, no change was merged for the key in
between, though that value (or any later one) would have been: divergence. If it holds another one, a change was
merged since the scan: in flight, whatever DynamoDB holds now (telling more would take reading DynamoDB again).

At size (10 million keys), no key's row or item is held in the driver's Python: a whole look (`Look`) compares the
two sides where they are stored (the check's Spark, `parity_look.py`) and brings back only the keys that differ, at
most `max_tracked_keys` of them (all are counted; past that many, the check fails whatever the settle time says). The
scan's pace is planned before it starts (`ScanPlan`): its estimated duration, from the table's size and the rate, is
checked against a bound, so a scan that would outlast the day between two checks is refused instead of overlapping.
"""

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ddb_athena.lake.dynamodb_json import item_to_wire
from ddb_athena.lake.table_keys import InvalidKeyError, Key, key_text

# Keys quoted in a result: enough to start an investigation, few enough for the UI. Never values.
EXAMPLE_KEYS = 5
MISSING = "missing from Iceberg"
EXTRA = "only in Iceberg"
DIFFERENT = "differs in value"
# 8 bytes: two different items share a digest with a chance of 2^-64.
DIGEST_BYTES = 8
# An eventually consistent Scan costs half a read unit a 4 KB of the items it reads (their sizes summed, not each
# rounded up as a GetItem's): a table's size over this is what its whole scan costs.
SCAN_BYTES_PER_READ_UNIT = 8192
_SETS = ("SS", "NS", "BS")


def _canonical(attribute: Mapping[str, Any]) -> Any:
    """An attribute value (wire DynamoDB JSON) with its set members sorted: DynamoDB sets have no order."""
    ((tag, value),) = attribute.items()
    if tag in _SETS:
        return {tag: sorted(value)}
    if tag == "M":
        return {tag: {name: _canonical(member) for name, member in value.items()}}
    if tag == "L":
        return {tag: [_canonical(member) for member in value]}
    return attribute


def item_digest(wire_item: Mapping[str, Mapping[str, Any]]) -> str:
    """A digest of a whole DynamoDB item in wire form (DynamoDB JSON, B as base64: an Iceberg row's item column, or
    `item_to_wire` of what boto3 reads): the same for the same content whatever the attribute or set member order."""
    canonical = {name: _canonical(value) for name, value in wire_item.items()}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=DIGEST_BYTES).hexdigest()


def item_json_digest(item_json: str | None) -> str | None:
    """`item_digest` of an item column's text (a Spark UDF: the items stay in the executors, only digests come back).
    Text that is not an item (never merged: it is quarantined) gets the digest of the text, which matches no item's."""
    if item_json is None:
        return None
    try:
        return item_digest(json.loads(item_json))
    except (ValueError, TypeError, AttributeError):
        return hashlib.blake2b(item_json.encode("utf-8"), digest_size=DIGEST_BYTES).hexdigest()


class Row(NamedTuple):
    """What the table holds for a key: the sequence number of the change its row was written from, its item's digest."""

    version: str | None
    digest: str | None


@dataclass(frozen=True)
class Difference:
    """How a key differs: where (MISSING, EXTRA, DIFFERENT), the change the table holds for it (its row's sequence
    number, or its newest tombstone's for a key missing from Iceberg), and the digest of the item DynamoDB held."""

    where: str
    table_version: str | None
    dynamodb_digest: str | None


def difference(row: Row | None, dynamodb_digest: str | None, tombstone: str | None) -> Difference | None:
    """How the table's `row` of a key differs from DynamoDB's item (its digest, None when there is none), or None."""
    if row is None:
        return None if dynamodb_digest is None else Difference(MISSING, tombstone, dynamodb_digest)
    if dynamodb_digest is None:
        return Difference(EXTRA, row.version, None)
    return None if row.digest == dynamodb_digest else Difference(DIFFERENT, row.version, dynamodb_digest)


@dataclass(frozen=True)
class KeyParity:
    iceberg_rows: int
    dynamodb_items: int
    in_flight: dict[str, str]
    unexplained: dict[str, str]
    # Keys that differed at the whole look past the most it tracks (`Look.untracked_keys`): never settled, so failed.
    untracked_keys: int = 0

    @property
    def passed(self) -> bool:
        return not self.unexplained and not self.untracked_keys

    def metadata(self) -> dict:
        examples = {key: self.unexplained[key] for key in sorted(self.unexplained)[:EXAMPLE_KEYS]}
        return {
            "iceberg_rows": self.iceberg_rows,
            "dynamodb_items": self.dynamodb_items,
            "difference": self.iceberg_rows - self.dynamodb_items,
            "keys_in_flight": len(self.in_flight),
            "unexplained_keys": len(self.unexplained),
            "unexplained_values": sum(where == DIFFERENT for where in self.unexplained.values()),
            "unexplained_examples": ", ".join(f"{_shown(key)} ({where})" for key, where in examples.items()) or "none",
            "untracked_differing_keys": self.untracked_keys,
        }


def _shown(key: Key | str) -> str:
    return key_text(key) if isinstance(key, tuple) else key


@dataclass(frozen=True)
class Look:
    """A whole look's outcome: how many rows and items each side holds, and what each holds for the keys that differ
    (a row and a digest, None on the side without the key), at most the tracked cap of them."""

    iceberg_rows: int
    dynamodb_items: int
    differing: Mapping[Key, tuple[Row | None, str | None]]
    # Keys that differ beyond those in `differing`: counted, not named.
    untracked_keys: int = 0


class ParityReaders(NamedTuple):
    """What a ParityTracker reads: a whole look (the table first, then DynamoDB), the table's rows of some keys, and
    the version of the newest delete of each of some keys the table ever applied."""

    look: Callable[[], Look]
    rows: Callable[[set[Key]], Mapping[Key, Row]]
    tombstones: Callable[[set[Key]], Mapping[Key, str]]


@dataclass
class ParityTracker:
    """Compares a table with DynamoDB over successive looks; a key must differ the same way for `settle_seconds`
    (longer than a change takes to reach the table) before it counts as divergence."""

    settle_seconds: float
    clock: Callable[[], float] = time.monotonic
    # key -> (how it differs, when it was first seen differing that way at a look that read DynamoDB after the table)
    _differing_since: dict[str, tuple[Difference, float]] = field(default_factory=dict)
    # Since the last whole look: its counts, and the keys a recheck found merged again since (in flight).
    _counts: tuple[int, int, int] = (0, 0, 0)
    _moved: dict[str, str] = field(default_factory=dict)

    def observe(self, readers: ParityReaders) -> KeyParity:
        """A whole look: every row of the table, then every item of DynamoDB."""
        # The table first (readers.look reads it so): an item written between the two reads then differs from a row
        # older than it, i.e. in flight, and a row unchanged at a later look was the table's before DynamoDB held the
        # item the scan read.
        read_at = self.clock()
        look = readers.look()
        missing = {key for key, (row, _) in look.differing.items() if row is None}
        tombstones = readers.tombstones(missing) if missing else {}
        differing = {}
        for key, (row, dynamodb_digest) in look.differing.items():
            found = difference(row, dynamodb_digest, tombstones.get(key))
            if found:
                differing[key] = found
        # The change behind a difference was made before the scan ended; the settle time counts from there.
        seen_at = self.clock()
        previous, self._differing_since, self._moved = self._differing_since, {}, {}
        for key, found in differing.items():
            earlier = previous.get(key)
            # A key that stopped differing, flipped, or differs from another merged change or DynamoDB value starts
            # over: each change gets its own settle time.
            self._differing_since[key] = earlier if earlier and earlier[0] == found else (found, seen_at)
        unexplained = {key: found.where for key, (found, since) in self._differing_since.items() if read_at - since >= self.settle_seconds}
        in_flight = {key: found.where for key, found in differing.items() if key not in unexplained}
        self._counts = (look.iceberg_rows, look.dynamodb_items, look.untracked_keys)
        return KeyParity(*self._counts[:2], in_flight, unexplained, look.untracked_keys)

    def recheck(self, readers: ParityReaders) -> KeyParity:
        """A second look at the keys that differed at the last whole look, at the table only (see the module's
        docstring): each that the table still holds as it did then is divergence once `settle_seconds` have passed,
        one it holds as DynamoDB did is merged, one the table merged another change for since is in flight. The
        counts are the last whole look's."""
        keys = set(self._differing_since)
        read_at = self.clock()
        iceberg = {key: row for key, row in readers.rows(keys).items() if key in keys} if keys else {}
        absent = keys - iceberg.keys()
        tombstones = readers.tombstones(absent) if absent else {}
        unexplained, in_flight = {}, {}
        for key, (was, since) in list(self._differing_since.items()):
            now = difference(iceberg.get(key), was.dynamodb_digest, tombstones.get(key))
            if now == was:
                (unexplained if read_at - since >= self.settle_seconds else in_flight)[key] = was.where
                continue
            del self._differing_since[key]
            if now is not None:
                self._moved[key] = now.where
        iceberg_rows, dynamodb_items, untracked = self._counts
        return KeyParity(iceberg_rows, dynamodb_items, {**self._moved, **in_flight}, unexplained, untracked)

    @property
    def awaited(self) -> set[str]:
        """Keys whose verdict waits for the settle time: they differ as they did at the last whole look."""
        return set(self._differing_since)

    def observe_until_settled(self, readers: ParityReaders, poll_seconds: float, sleep: Callable[[float], None] = time.sleep) -> KeyParity:
        """One whole look, then second looks at the table every `poll_seconds` until every key that differed is
        merged, in flight with a change merged since, or settled as divergence: at most `settle_seconds` after the
        scan ended, however long it took."""
        parity = self.observe(readers)
        while self.awaited - parity.unexplained.keys():
            sleep(poll_seconds)
            parity = self.recheck(readers)
        return parity


@dataclass
class KeyScan:
    """What a paced scan read (never its items, nor their keys): how many, the read units DynamoDB says it consumed,
    and how long it took."""

    items: int = 0
    read_units: float = 0.0
    seconds: float = 0.0
    pages: int = 0
    # Items whose key the table's key columns cannot hold (1.5 in a decimal(38,0) key): the sync quarantines their
    # changes, so the table has no row to compare them with. Counted, never compared.
    unholdable_keys: int = 0


@dataclass(frozen=True)
class ScanPlan:
    """A scan's pace, and what DescribeTable says of the table's size (AWS refreshes it about every six hours)."""

    read_units_per_second: float
    provisioned: bool
    table_bytes: int
    table_items: int

    @property
    def estimated_seconds(self) -> float:
        return self.table_bytes / SCAN_BYTES_PER_READ_UNIT / self.read_units_per_second


def scan_plan(dynamodb, table_name: str, capacity_share: float, on_demand_read_units_per_second: float) -> ScanPlan:
    """The pace of a scan: a share of a provisioned table's read capacity (the application keeps the rest), or a fixed
    rate on an on-demand table (priced by the unit, whatever the pace), whichever is lower."""
    table = dynamodb.describe_table(TableName=table_name)["Table"]
    provisioned = table.get("ProvisionedThroughput", {}).get("ReadCapacityUnits") or 0
    rate = min(on_demand_read_units_per_second, capacity_share * provisioned) if provisioned else on_demand_read_units_per_second
    return ScanPlan(rate, bool(provisioned), table.get("TableSizeBytes", 0), table.get("ItemCount", 0))


# Where a scan's pages go: each page's (key, digest) pairs, as soon as it is read.
DigestSink = Callable[[list[tuple[Key, str]]], None]


def paced_item_digests(
    dynamodb,
    table_name: str,
    key_of: Callable[[Mapping[str, Any]], Key],
    read_units_per_second: float,
    sink: DigestSink,
    segments: int = 4,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> KeyScan:
    """Every item's key and digest, handed to `sink` a page at a time, in `segments` scan segments read in turn,
    paced so that the read units consumed (as DynamoDB reports them) average at most `read_units_per_second`. Whole
    items: a projection to the key would not lower the units (they count the items' whole size). Eventually
    consistent: half the units of a consistent read, and a key in flight is told apart by the settle time anyway.
    Only digests leave, never values; nothing is kept here."""
    if read_units_per_second <= 0:
        raise ValueError(f"a scan's read rate must be positive, got {read_units_per_second}")
    scan, started = KeyScan(), clock()
    paginator = dynamodb.get_paginator("scan")
    for segment in range(segments):
        pages = paginator.paginate(TableName=table_name, Segment=segment, TotalSegments=segments, ReturnConsumedCapacity="TOTAL")
        for page in pages:
            digests = []
            for item in page["Items"]:
                try:
                    digests.append((key_of(item), item_digest(item_to_wire(item))))
                except InvalidKeyError:
                    scan.unholdable_keys += 1
            sink(digests)
            scan.items += len(page["Items"])
            scan.read_units += page.get("ConsumedCapacity", {}).get("CapacityUnits", 0.0)
            scan.pages += 1
            # Paced by what was consumed so far: the next page waits until the average is back at the rate.
            wait = started + scan.read_units / read_units_per_second - clock()
            if wait > 0:
                sleep(wait)
    scan.seconds = clock() - started
    return scan
