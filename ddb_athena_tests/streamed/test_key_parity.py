"""Parity tells keys in flight from divergence by how long they differ, and from which change, on a clock the test moves."""

from ddb_athena.streamed.key_parity import EXTRA, MISSING, ParityTracker
from ddb_athena_tests.fake_clock import FakeClock


def rows(keys) -> dict:
    """A set of keys as the table's rows, all written from one change; a dict as given (key -> row version)."""
    return keys if isinstance(keys, dict) else dict.fromkeys(keys, "1")


def no_tombstones(keys):
    return {}


def observe(tracker, iceberg, dynamodb, tombstones=None):
    return tracker.observe(lambda: rows(iceberg), lambda: dynamodb, lambda keys: {key: tombstones[key] for key in keys & (tombstones or {}).keys()})


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


def test_waiting_ends_when_the_first_keys_are_merged_though_new_writes_keep_arriving():
    clock = FakeClock()
    tracker = ParityTracker(settle_seconds=60, clock=clock)
    writes = iter(range(1000))
    merged: set[str] = set()
    written = {"old"}

    def dynamodb():
        written.add(f"w{next(writes)}")  # a write lands before every scan
        return written

    def iceberg():
        merged.update(key for key in written if key != "w0" or clock.now >= 12)  # w0 takes two polls to merge
        return set(merged)

    parity = tracker.observe_until_settled(lambda: rows(iceberg()), dynamodb, no_tombstones, poll_seconds=5, sleep=clock.sleep)
    assert parity.passed and "w0" not in parity.in_flight and clock.now == 15


def test_waiting_ends_with_divergence_once_the_settle_time_has_passed():
    clock = FakeClock()
    tracker = ParityTracker(settle_seconds=12, clock=clock)
    parity = tracker.observe_until_settled(lambda: rows({"a", "ghost"}), lambda: {"a"}, no_tombstones, poll_seconds=5, sleep=clock.sleep)
    assert not parity.passed and parity.unexplained == {"ghost": EXTRA} and clock.now == 15


def test_waiting_is_bounded_for_a_key_that_keeps_changing():
    clock = FakeClock()
    tracker = ParityTracker(settle_seconds=10, clock=clock)
    looks = iter(range(1000))
    # Deleted, then inserted again, between every two looks: it flips from only in Iceberg to missing and back.
    phase = {"even": True}

    def iceberg():
        phase["even"] = next(looks) % 2 == 0
        return {"a", "busy"} if phase["even"] else {"a"}

    def dynamodb():
        return {"a"} if phase["even"] else {"a", "busy"}

    parity = tracker.observe_until_settled(lambda: rows(iceberg()), dynamodb, no_tombstones, poll_seconds=5, sleep=clock.sleep)
    assert parity.passed and "busy" in parity.in_flight and clock.now == 20
