"""Parity tells keys in flight from divergence by how long they differ, on a clock the test moves."""

from ddb_athena.key_parity import EXTRA, MISSING, ParityTracker


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def observe(tracker, iceberg, dynamodb):
    return tracker.observe(lambda: iceberg, lambda: dynamodb)


def test_a_key_merged_within_the_settle_time_was_in_flight_and_one_that_still_differs_after_it_is_divergence():
    clock = Clock()
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
    clock = Clock()
    tracker = ParityTracker(settle_seconds=10, clock=clock)
    observe(tracker, {"a"}, {"a", "b"})  # b inserted, in flight
    clock.sleep(6)
    observe(tracker, {"a", "b"}, {"a", "b"})  # merged
    clock.sleep(6)
    assert observe(tracker, {"a", "b"}, {"a"}).in_flight == {"b": EXTRA}  # deleted since: a new change
    clock.sleep(6)
    again = observe(tracker, {"a"}, {"a", "b"})  # and inserted again: missing, 18 s after b first differed
    assert again.passed and again.in_flight == {"b": MISSING}


def test_waiting_ends_when_the_first_keys_are_merged_though_new_writes_keep_arriving():
    clock = Clock()
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

    parity = tracker.observe_until_settled(iceberg, dynamodb, poll_seconds=5, sleep=clock.sleep)
    assert parity.passed and "w0" not in parity.in_flight and clock.now == 15


def test_waiting_ends_with_divergence_once_the_settle_time_has_passed():
    clock = Clock()
    tracker = ParityTracker(settle_seconds=12, clock=clock)
    parity = tracker.observe_until_settled(lambda: {"a", "ghost"}, lambda: {"a"}, poll_seconds=5, sleep=clock.sleep)
    assert not parity.passed and parity.unexplained == {"ghost": EXTRA} and clock.now == 15


def test_waiting_is_bounded_for_a_key_that_keeps_changing():
    clock = Clock()
    tracker = ParityTracker(settle_seconds=10, clock=clock)
    looks = iter(range(1000))
    # Deleted, then inserted again, between every two looks: it flips from only in Iceberg to missing and back.
    phase = {"even": True}

    def iceberg():
        phase["even"] = next(looks) % 2 == 0
        return {"a", "busy"} if phase["even"] else {"a"}

    def dynamodb():
        return {"a"} if phase["even"] else {"a", "busy"}

    parity = tracker.observe_until_settled(iceberg, dynamodb, poll_seconds=5, sleep=clock.sleep)
    assert parity.passed and "busy" in parity.in_flight and clock.now == 20
