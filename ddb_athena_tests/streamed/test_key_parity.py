"""Parity tells keys in flight from divergence by how long they differ, and from which change, on a clock the test moves."""

import json

from ddb_athena.lake.dynamodb_json import item_to_wire
from ddb_athena.streamed.key_parity import DIFFERENT, EXTRA, MISSING, Look, ParityReaders, ParityTracker, Row, item_digest, item_json_digest
from ddb_athena_tests.fake_clock import FakeClock

# The digest of the value DynamoDB and the table hold for a key, unless a test says otherwise.
VALUE = "v"


def rows(table) -> dict:
    """The table's rows: a set of keys, each written from change 1 with VALUE; a dict of key -> row version (with VALUE)
    or key -> Row."""
    if isinstance(table, dict):
        return {key: row if isinstance(row, Row) else Row(row, VALUE) for key, row in table.items()}
    return {key: Row("1", VALUE) for key in table}


def items(dynamodb) -> dict:
    """DynamoDB's items: a set of keys (each holding VALUE) or a dict key -> digest."""
    return dict(dynamodb) if isinstance(dynamodb, dict) else dict.fromkeys(dynamodb, VALUE)


def tombstones_of(tombstones=None):
    return lambda keys: {key: tombstones[key] for key in keys & (tombstones or {}).keys()}


def no_tombstones(keys):
    return {}


def look_of(iceberg: dict, dynamodb: dict) -> Look:
    """A whole look at two sides held in memory: what Spark finds joining them (parity_look.py)."""
    differing = {
        key: (iceberg.get(key), dynamodb.get(key))
        for key in iceberg.keys() | dynamodb.keys()
        if key not in iceberg or key not in dynamodb or iceberg[key].digest != dynamodb[key]
    }
    return Look(len(iceberg), len(dynamodb), differing)


def observe(tracker, iceberg, dynamodb, tombstones=None):
    table = rows(iceberg)
    readers = ParityReaders(lambda: look_of(table, items(dynamodb)), lambda keys: {key: table[key] for key in keys & table.keys()}, tombstones_of(tombstones))
    return tracker.observe(readers)


def test_a_key_merged_within_the_settle_time_was_in_flight_and_one_that_still_differs_after_it_is_divergence():
    clock = FakeClock()
    tracker = ParityTracker(settle_seconds=30, clock=clock)
    first = observe(tracker, {"a"}, {"a", "new", "lost"})
    assert first.passed and first.in_flight == {"new": MISSING, "lost": MISSING} and first.metadata()["difference"] == -2

    clock.sleep(29)
    assert observe(tracker, {"a", "new"}, {"a", "new", "lost"}).in_flight == {"lost": MISSING}
    clock.sleep(1)
    settled = observe(tracker, {"a", "new"}, {"a", "new", "lost"})
    assert not settled.passed and settled.unexplained == {"lost": MISSING} and settled.in_flight == {}
    assert settled.metadata()["unexplained_examples"] == "lost (missing from Iceberg)"


def test_a_key_that_stops_differing_or_flips_starts_its_settle_time_over():
    clock = FakeClock()
    tracker = ParityTracker(settle_seconds=10, clock=clock)
    observe(tracker, {"a"}, {"a", "b"})  # b inserted, in flight
    clock.sleep(6)
    observe(tracker, {"a", "b"}, {"a", "b"})  # merged
    clock.sleep(6)
    assert observe(tracker, {"a", "b"}, {"a"}).in_flight == {"b": EXTRA}  # deleted since: a new change
    clock.sleep(6)
    again = observe(tracker, {"a"}, {"a", "b"})  # and inserted again: missing, 18 s after b first differed
    assert again.passed and again.in_flight == {"b": MISSING}


def test_a_key_caught_in_flight_at_two_looks_with_merged_changes_between_them_is_not_divergence():
    # Looks come a minute apart in a sync run: between two, a key can be deleted, inserted again, merged, and
    # changed once more, so both looks catch it differing the same way. The change the table holds tells.
    clock = FakeClock()
    tracker = ParityTracker(settle_seconds=10, clock=clock)
    assert observe(tracker, {"a": "1", "b": "5"}, {"a"}).in_flight == {"b": EXTRA}  # b's delete in flight
    clock.sleep(12)  # merged; b inserted again (row from change 7), merged, and deleted again: in flight
    again = observe(tracker, {"a": "1", "b": "7"}, {"a"})
    assert again.passed and again.in_flight == {"b": EXTRA}

    assert observe(tracker, {"a": "1"}, {"a", "c"}).in_flight == {"c": MISSING}  # c's insert in flight
    clock.sleep(12)  # merged; c deleted (tombstone from change 9), merged, and inserted again: in flight
    again = observe(tracker, {"a": "1"}, {"a", "c"}, tombstones={"c": "9"})
    assert again.passed and again.in_flight == {"c": MISSING}

    clock.sleep(12)  # no change merged for c since the last look: a stuck key, whatever happened before
    stuck = observe(tracker, {"a": "1"}, {"a", "c"}, tombstones={"c": "9"})
    assert not stuck.passed and stuck.unexplained == {"c": MISSING}


def test_a_value_that_differs_is_compared_with_the_change_behind_it_and_the_value_dynamodb_holds():
    clock = FakeClock()
    tracker = ParityTracker(settle_seconds=10, clock=clock)
    # Updated in DynamoDB, the update not merged yet: the same key on both sides, another value.
    first = observe(tracker, {"a": Row("1", "old")}, {"a": "new"})
    assert first.passed and first.in_flight == {"a": DIFFERENT} and first.metadata()["difference"] == 0
    clock.sleep(12)  # updated again in DynamoDB before this look: another value, a change of its own
    assert observe(tracker, {"a": Row("1", "old")}, {"a": "newer"}).in_flight == {"a": DIFFERENT}
    clock.sleep(12)  # neither merged since
    stuck = observe(tracker, {"a": Row("1", "old")}, {"a": "newer"})
    assert not stuck.passed and stuck.unexplained == {"a": DIFFERENT}
    assert stuck.metadata()["unexplained_examples"] == "a (differs in value)" and stuck.metadata()["unexplained_values"] == 1


class Readers:
    """A table and a DynamoDB table the test changes; the DynamoDB scan takes `scan_seconds` on the clock (a table
    large enough that its scan outlasts the settle time many times over). Records what each read asked for."""

    def __init__(self, clock: FakeClock, iceberg, dynamodb, scan_seconds: float = 3600, tombstones=None):
        self.clock, self.scan_seconds = clock, scan_seconds
        self.iceberg, self.dynamodb, self.tombstones = rows(iceberg), items(dynamodb), dict(tombstones or {})
        self.scans, self.row_reads = 0, []

    def read_rows(self, keys=None):
        self.row_reads.append(keys)
        return {key: row for key, row in self.iceberg.items() if keys is None or key in keys}

    def scan(self):
        self.scans += 1
        self.clock.sleep(self.scan_seconds)
        return dict(self.dynamodb)

    def read_tombstones(self, keys):
        return {key: self.tombstones[key] for key in keys & self.tombstones.keys()}

    def look(self):
        return look_of(self.read_rows(), self.scan())  # the table first

    def settle(self, tracker: ParityTracker, sleep=None):
        readers = ParityReaders(self.look, self.read_rows, self.read_tombstones)
        return tracker.observe_until_settled(readers, poll_seconds=5, sleep=sleep or self.clock.sleep)


def test_a_key_missing_from_the_table_is_divergence_though_the_scan_outlasts_the_settle_time():
    clock = FakeClock()
    readers = Readers(clock, {"a"}, {"a", "lost"})
    parity = readers.settle(ParityTracker(settle_seconds=60, clock=clock))
    assert not parity.passed and parity.unexplained == {"lost": MISSING} and parity.in_flight == {}
    # The verdict comes the settle time after the scan ended, from second looks at the table's rows of that key only:
    # DynamoDB is scanned once.
    assert clock.now == 3600 + 60 and readers.scans == 1
    assert readers.row_reads[0] is None and set(map(frozenset, readers.row_reads[1:])) == {frozenset({"lost"})}
    assert parity.iceberg_rows == 1 and parity.dynamodb_items == 2  # the whole look's counts


def test_a_key_with_another_value_is_divergence_though_the_scan_outlasts_the_settle_time():
    clock = FakeClock()
    readers = Readers(clock, {"a": "1", "edited": Row("4", "edited by hand")}, {"a": VALUE, "edited": "as written"})
    parity = readers.settle(ParityTracker(settle_seconds=60, clock=clock))
    assert not parity.passed and parity.unexplained == {"edited": DIFFERENT} and clock.now == 3660


def test_a_key_only_in_the_table_is_divergence_though_the_scan_outlasts_the_settle_time():
    clock = FakeClock()
    readers = Readers(clock, {"a": "1", "ghost": "5"}, {"a"})
    parity = readers.settle(ParityTracker(settle_seconds=60, clock=clock))
    assert not parity.passed and parity.unexplained == {"ghost": EXTRA} and clock.now == 3660


def test_keys_changed_in_flight_between_the_looks_are_not_divergence_and_the_check_waits_only_for_the_others():
    clock = FakeClock()
    # At the scan, four keys differ: a and b were updated, c inserted and d deleted in DynamoDB, none merged yet.
    readers = Readers(
        clock,
        {"a": Row("1", "old a"), "b": Row("1", "old b"), "d": "3", "e": "1"},
        {"a": "new a", "b": "new b", "c": "c", "e": VALUE},
        tombstones={"c": "2"},
    )
    merges = iter(range(100))

    def sleep(seconds):
        clock.sleep(seconds)
        if next(merges) == 1:  # between the second and third looks, the sync merges what was in flight, and more:
            readers.iceberg["a"] = Row("6", "new a")  # a's update, as the scan read it
            readers.iceberg["b"] = Row("8", "newer b")  # b's update and one made after the scan
            readers.iceberg["c"] = Row("7", "c")  # c's insert
            readers.tombstones["d"] = "9"  # d's delete
            del readers.iceberg["d"]

    parity = readers.settle(ParityTracker(settle_seconds=60, clock=clock), sleep=sleep)
    # b's row is another change than at the scan: in flight (DynamoDB is not read again to tell more); the others
    # match what the scan read. No verdict waits for the settle time.
    assert parity.passed and parity.in_flight == {"b": DIFFERENT} and parity.unexplained == {}
    assert clock.now == 3600 + 10 and readers.scans == 1


def test_a_stuck_key_turns_red_even_when_the_others_differing_with_it_are_merged():
    clock = FakeClock()
    readers = Readers(clock, {"a": "1", "stuck": Row("2", "old")}, {"a", "new", "stuck"})

    def sleep(seconds):
        clock.sleep(seconds)
        readers.iceberg["new"] = Row("3", VALUE)  # merged at once; stuck's update never is

    parity = readers.settle(ParityTracker(settle_seconds=12, clock=clock), sleep=sleep)
    assert not parity.passed and parity.unexplained == {"stuck": DIFFERENT} and parity.in_flight == {}
    assert clock.now == 3600 + 15


def test_the_check_does_not_wait_when_nothing_differs():
    clock = FakeClock()
    readers = Readers(clock, {"a", "b"}, {"a", "b"}, scan_seconds=10)
    parity = readers.settle(ParityTracker(settle_seconds=60, clock=clock))
    assert parity.passed and parity.in_flight == {} and clock.now == 10 and readers.row_reads == [None]


def test_a_digest_is_of_the_whole_item_whatever_the_order_of_its_attributes_and_set_members():
    item = {
        "id": {"S": "b1"},
        "name": {"S": "Ærø — 📚"},
        "price": {"N": "12.5"},
        "cover": {"B": b"\x00\x01"},
        "tags": {"SS": ["x", "y"]},
        "fingerprints": {"BS": [b"\x01", b"\x02"]},
        "publisher": {"M": {"name": {"S": "P"}, "ratings": {"NS": ["1", "4.5"]}}},
        "editions": {"L": [{"M": {"year": {"N": "1999"}}}, {"NULL": True}, {"BOOL": False}]},
    }
    # As the table's item column holds it: the stream's image as JSON (another attribute, set and escaping order).
    reordered = dict(reversed(list(item.items())))
    reordered["tags"] = {"SS": ["y", "x"]}
    reordered["fingerprints"] = {"BS": [b"\x02", b"\x01"]}
    reordered["publisher"] = {"M": {"ratings": {"NS": ["4.5", "1"]}, "name": {"S": "P"}}}
    column = json.dumps(item_to_wire(reordered), ensure_ascii=True)
    assert item_json_digest(column) == item_digest(item_to_wire(item))
    # Any other value, type or attribute is another digest; so is text that is not an item.
    for other in ({**item, "price": {"N": "12.6"}}, {**item, "price": {"S": "12.5"}}, {**item, "extra": {"NULL": True}}):
        assert item_digest(item_to_wire(other)) != item_digest(item_to_wire(item))
    assert item_json_digest("<html>") != item_json_digest(column) and item_json_digest(None) is None
