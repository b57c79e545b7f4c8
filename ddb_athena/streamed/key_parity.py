"""Whether an Iceberg table holds the same keys as its DynamoDB table, told apart from changes in flight.

Under live writes the two never match at one instant: an item written after the last capture is in
DynamoDB and not yet in Iceberg (or still in Iceberg after a delete). Such a key differs once and is
merged within a cycle or two. A key that still differs in the same way `settle_seconds` after it was
first seen is a real divergence (a lost change, a row deleted from the table by hand): only those fail.

"The same way" includes the change the table last merged for the key: the sequence number its row was written
from (a key only in Iceberg) or that of its newest tombstone (a key missing from Iceberg). Looks come a minute
apart in a sync run, and a key deleted, inserted again and deleted again in between is caught in flight at both
looks: its row is another one, so it is a new change, not a stuck one.
"""

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

# Keys quoted in a result: enough to start an investigation, few enough for the UI.
EXAMPLE_KEYS = 5
MISSING = "missing from Iceberg"
EXTRA = "only in Iceberg"


@dataclass(frozen=True)
class KeyParity:
    iceberg_rows: int
    dynamodb_items: int
    in_flight: dict[str, str]
    unexplained: dict[str, str]

    @property
    def passed(self) -> bool:
        return not self.unexplained

    def metadata(self) -> dict:
        examples = {key: self.unexplained[key] for key in sorted(self.unexplained)[:EXAMPLE_KEYS]}
        return {
            "iceberg_rows": self.iceberg_rows,
            "dynamodb_items": self.dynamodb_items,
            "difference": self.iceberg_rows - self.dynamodb_items,
            "keys_in_flight": len(self.in_flight),
            "unexplained_keys": len(self.unexplained),
            "unexplained_examples": ", ".join(f"{key} ({where})" for key, where in examples.items()) or "none",
        }


@dataclass
class ParityTracker:
    """Compares key sets over successive observations; a key must differ the same way for `settle_seconds`
    (longer than a change takes to reach the table) before it counts as divergence."""

    settle_seconds: float
    clock: Callable[[], float] = time.monotonic
    # key -> ((how it differs, the version of the key the table holds), when it was first seen differing that way)
    _differing_since: dict[str, tuple[tuple[str, str | None], float]] = field(default_factory=dict)

    def observe(
        self,
        read_iceberg_rows: Callable[[], Mapping[str, str | None]],
        read_dynamodb_keys: Callable[[], Iterable[str]],
        read_tombstones: Callable[[set[str]], Mapping[str, str]],
    ) -> KeyParity:
        """`read_iceberg_rows`: the table's keys with the version of each row; `read_tombstones(keys)`: the version
        of the newest delete of each of `keys` the table ever applied."""
        # Iceberg first: an item written between the two reads is then always "missing", i.e. in flight.
        read_at = self.clock()
        iceberg = dict(read_iceberg_rows())
        dynamodb = set(read_dynamodb_keys())
        missing = dynamodb - iceberg.keys()
        tombstones = read_tombstones(missing) if missing else {}
        differing = {key: (MISSING, tombstones.get(key)) for key in missing} | {key: (EXTRA, iceberg[key]) for key in iceberg.keys() - dynamodb}
        # The change behind a difference was made before the scan ended; the settle time counts from there.
        seen_at = self.clock()
        previous, self._differing_since = self._differing_since, {}
        for key, difference in differing.items():
            earlier = previous.get(key)
            # A key that stopped differing, flipped, or differs from another merged change starts over: each change
            # gets its own settle time.
            self._differing_since[key] = earlier if earlier and earlier[0] == difference else (difference, seen_at)
        unexplained = {key: where for key, ((where, _), since) in self._differing_since.items() if read_at - since >= self.settle_seconds}
        in_flight = {key: where for key, (where, _) in differing.items() if key not in unexplained}
        return KeyParity(len(iceberg), len(dynamodb), in_flight, unexplained)

    def observe_until_settled(
        self,
        read_iceberg_rows: Callable[[], Mapping[str, str | None]],
        read_dynamodb_keys: Callable[[], Iterable[str]],
        read_tombstones: Callable[[set[str]], Mapping[str, str]],
        poll_seconds: float,
        sleep: Callable[[float], None] = time.sleep,
    ) -> KeyParity:
        """Observes until every key that differed at the first look is merged or has settled as divergence: for a
        check run on its own, beside a sync run that merges what is in flight (at most `settle_seconds` more, or twice
        that for a key that keeps changing, which stays in flight)."""
        deadline = self.clock() + 2 * self.settle_seconds
        parity = self.observe(read_iceberg_rows, read_dynamodb_keys, read_tombstones)
        awaited = set(parity.in_flight)
        while awaited & parity.in_flight.keys() and self.clock() < deadline:
            sleep(poll_seconds)
            parity = self.observe(read_iceberg_rows, read_dynamodb_keys, read_tombstones)
        return parity


@dataclass
class KeyScan:
    """A key scan paced to a read rate: what it read, and the read units DynamoDB says it consumed."""

    keys: list[str] = field(default_factory=list)
    read_units: float = 0.0
    seconds: float = 0.0
    pages: int = 0


def read_rate_for(dynamodb, table_name: str, capacity_share: float, on_demand_read_units_per_second: float) -> float:
    """Read units a second a scan may use: a share of a provisioned table's read capacity (the application keeps the
    rest), or a fixed rate on an on-demand table, whichever is lower."""
    provisioned = dynamodb.describe_table(TableName=table_name)["Table"].get("ProvisionedThroughput", {}).get("ReadCapacityUnits") or 0
    return min(on_demand_read_units_per_second, capacity_share * provisioned) if provisioned else on_demand_read_units_per_second


def paced_keys(
    dynamodb,
    table_name: str,
    attribute: str,
    type_tag: str,
    read_units_per_second: float,
    segments: int = 4,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> KeyScan:
    """Every item's key, in `segments` scan segments read in turn, paced so that the read units consumed (as DynamoDB
    reports them) average at most `read_units_per_second`. Eventually consistent: half the units of a consistent read,
    and a key in flight is told apart by the settle time anyway. A projection does not lower the units: they count
    the items' whole size."""
    if read_units_per_second <= 0:
        raise ValueError(f"a scan's read rate must be positive, got {read_units_per_second}")
    scan, started = KeyScan(), clock()
    paginator = dynamodb.get_paginator("scan")
    for segment in range(segments):
        pages = paginator.paginate(
            TableName=table_name,
            ProjectionExpression="#key",
            ExpressionAttributeNames={"#key": attribute},
            Segment=segment,
            TotalSegments=segments,
            ReturnConsumedCapacity="TOTAL",
        )
        for page in pages:
            scan.keys += [item[attribute][type_tag] for item in page["Items"]]
            scan.read_units += page.get("ConsumedCapacity", {}).get("CapacityUnits", 0.0)
            scan.pages += 1
            # Paced by what was consumed so far: the next page waits until the average is back at the rate.
            wait = started + scan.read_units / read_units_per_second - clock()
            if wait > 0:
                sleep(wait)
    scan.seconds = clock() - started
    return scan
