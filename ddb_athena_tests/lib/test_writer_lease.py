"""The writer lease on the emulator's S3: one holder, renewed while it lives, expired when it dies."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta

import pytest

from ddb_athena.lib.writer_lease import MAX_CLOCK_SKEW_SECONDS, ClockSkewError, LeaseHeldError, LeaseLostError, WriterLease
from ddb_athena_tests.fake_clock import CountedProbe, FakeClock, wait_for


def lease(settings, holder: str, ttl: float = 3.0, **kwargs) -> WriterLease:
    return WriterLease(settings.client("s3"), settings.bucket, "library.books", holder, ttl_seconds=ttl, **kwargs)


def test_a_second_writer_stops_with_a_message_naming_the_holder(settings):
    first = lease(settings, "dagster run aaaa (books_sync)")
    first.acquire()
    try:
        second = FakeClock()  # its wait passes at once
        with pytest.raises(LeaseHeldError, match=r"library\.books has another writer: dagster run aaaa \(books_sync\)"):
            lease(settings, "dagster run bbbb (__ASSET_JOB)", clock=second, sleep=second.sleep).acquire(wait_seconds=0.5)
    finally:
        first.release()
    assert lease(settings, "dagster run bbbb").read().released


def test_a_live_holder_keeps_its_lease_past_its_time_to_live(settings):
    holder = lease(settings, "the sync", ttl=3.0)
    holder.acquire()
    try:
        # Waits twice the time to live while the holder renews (every 1 s): never judged expired.
        with pytest.raises(LeaseHeldError):
            lease(settings, "a contender", ttl=3.0).acquire(wait_seconds=6.0)
        holder.check()
    finally:
        holder.release()


def test_released_lease_is_free_at_once(settings):
    with lease(settings, "first"):
        pass
    started = time.monotonic()
    with lease(settings, "second") as second:
        second.check()
    assert time.monotonic() - started < 1.0


def test_each_holding_of_a_lease_is_one_epoch_after_the_one_before_released_or_expired(settings):
    """The epoch orders a table's holdings (a fence compares them: lake/writer_branch.py): the first is 1, each later one
    the one before plus one, whether that one released the lease or let it expire; a renewal keeps it."""
    with lease(settings, "first") as first:
        assert first.epoch == 1
    with lease(settings, "second") as second:
        second.renew()
        assert second.epoch == 2 and second.read().epoch == 2
    dead = lease(settings, "a writer that dies", ttl=1.0)
    dead.acquire()
    dead._stop.set()  # its renewals stop, as if it died
    with lease(settings, "its successor", ttl=1.0) as successor:
        assert successor.epoch == 4 and not successor.read().released
    assert dead.read().released and dead.read().epoch == 4  # released by its holder, the epoch kept for the next


HOLDER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import boto3
    from ddb_athena.lib.writer_lease import WriterLease
    lease = WriterLease(boto3.client("s3"), sys.argv[1], "library.books", "a holder that will be killed", ttl_seconds=float(sys.argv[2]))
    lease.acquire()
    print("held", flush=True)
    time.sleep(600)
    """
)


@pytest.mark.subprocess
def test_a_killed_holder_does_not_block_the_next_writer_past_the_lease_time(settings):
    ttl = 3.0
    holder = subprocess.Popen([sys.executable, "-c", HOLDER_SCRIPT, settings.bucket, str(ttl)], stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        assert holder.stdout.readline().strip() == "held"
        # Alive: it renews, a contender that waits one time to live does not get in.
        with pytest.raises(LeaseHeldError, match="a holder that will be killed"):
            lease(settings, "next writer", ttl=ttl).acquire(wait_seconds=ttl)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    killed_at = time.monotonic()
    successor = lease(settings, "next writer", ttl=ttl)
    successor.acquire(wait_seconds=4 * ttl)
    waited = time.monotonic() - killed_at
    try:
        # Expired by S3's clock: a time to live after the holder's last renewal, plus a poll.
        assert ttl <= waited <= ttl + 3.0, waited
        assert successor.read().body["holder"] == "next writer"
    finally:
        successor.release()


def test_a_holder_whose_lease_was_taken_over_cannot_commit(settings):
    clock = FakeClock()
    stalled = lease(settings, "a stalled writer", ttl=2.0, clock=clock)
    stalled.acquire()
    stalled._stop.set()  # its renewals stop, as in a process frozen by a long pause
    # A renewal older than two thirds of the time to live by its own clock: no commit, even before anybody took over.
    clock.now += 1.4
    with pytest.raises(LeaseLostError, match="has not been renewed for 1 s"):
        stalled.check()

    contender = lease(settings, "a contender", ttl=2.0)
    contender.acquire(wait_seconds=10.0)  # once S3's clock says the lease is older than its time to live
    try:
        with pytest.raises(LeaseLostError, match="taken over by a contender"):
            stalled.renew()
        with pytest.raises(LeaseLostError, match="taken over"):
            stalled.check()
        stalled.release()  # deletes nothing: the lease is the contender's now
        assert contender.read().body["holder"] == "a contender"
        contender.check()
    finally:
        contender.release()


def test_expiry_is_judged_by_s3s_clock_not_by_hosts_whose_clocks_disagree(settings):
    minute = timedelta(seconds=60)
    holder = lease(settings, "a holder whose clock is a minute behind", ttl=2.0, wall_clock=lambda: datetime.now(UTC) - minute)
    holder.acquire()
    try:
        # Its record says it renewed a minute ago and the contender's clock runs a minute ahead: a contender that
        # judged by the hosts' clocks would take this live lease at once (it used to, with ~50 s of skew). Its own
        # clock only times its tries (three, its waits skipped).
        contender = FakeClock()
        with pytest.raises(LeaseHeldError):
            lease(
                settings, "a contender a minute ahead", ttl=2.0, wall_clock=lambda: datetime.now(UTC) + minute, clock=contender, sleep=contender.sleep
            ).acquire(wait_seconds=4.0)
        # It holds the lease, but may not commit with its clock a minute off (see the clock skew test).
        with pytest.raises(ClockSkewError):
            holder.check()
    finally:
        holder.release()
    # And a lease left by a dead holder is taken once S3 says it is older than its time to live, whatever it claims.
    dead = lease(settings, "a dead holder whose clock is a minute ahead", ttl=2.0, wall_clock=lambda: datetime.now(UTC) + minute)
    dead.acquire()
    dead._stop.set()
    started = time.monotonic()
    successor = lease(settings, "the next writer", ttl=2.0)
    successor.acquire(wait_seconds=10.0)
    try:
        assert 1.0 <= time.monotonic() - started <= 6.0
        assert successor.read().body["holder"] == "the next writer"
    finally:
        successor.release()


class ResponseLostOnce:
    """An S3 client whose chosen put_object lands in S3 but whose response is lost, so the caller's retry is sent
    again (as botocore retries a request whose connection dropped): S3 answers the retry on its new state."""

    def __init__(self, s3, lose_put_number: int):
        self._s3, self._lose, self.puts = s3, lose_put_number, 0

    def put_object(self, **kwargs):
        self.puts += 1
        if self.puts == self._lose:
            self._s3.put_object(**kwargs)  # landed; the answer never arrived
        return self._s3.put_object(**kwargs)

    def __getattr__(self, name):
        return getattr(self._s3, name)


@pytest.mark.parametrize(("lost", "what"), [(1, "the create"), (2, "a renewal")])
def test_a_write_whose_response_was_lost_is_not_mistaken_for_a_takeover(settings, lost, what):
    s3 = ResponseLostOnce(settings.client("s3"), lose_put_number=lost)
    holder = WriterLease(s3, settings.bucket, "library.books", "a writer on a flaky network", ttl_seconds=30.0)
    holder.acquire(wait_seconds=1.0)  # the create: its retry finds the lease existing (412), and its own
    try:
        holder._stop.set()  # renewals by hand below
        holder.renew()
        holder.renew()
        holder.check()
        assert s3.puts == 3 and holder.read().body["holder"] == "a writer on a flaky network", what
    finally:
        holder.release()
    assert holder.read().released  # released with the ETag it adopted


def test_a_writer_that_makes_no_progress_lets_its_lease_expire(settings):
    """A sync whose main thread hangs used to keep its lease forever (the renewer thread renewed regardless)."""
    steps = {"completed_tasks": 0}
    clock, tasks = FakeClock(), CountedProbe(lambda: steps["completed_tasks"])
    working = lease(settings, "a writer whose Spark tasks complete", ttl=3.0, stall_seconds=4.0, clock=clock, progress=tasks)
    hung = WriterLease(settings.client("s3"), settings.bucket, "library.orders", "a hung writer", ttl_seconds=3.0, stall_seconds=4.0, clock=clock)
    working.acquire()
    hung.acquire()
    try:
        for _ in range(4):  # 8 s by their clock: twice the stall limit
            clock.sleep(2.0)
            steps["completed_tasks"] += 1
            tasks.wait()  # seen by the working one's renewer
        hung._renewer.join(timeout=10.0)  # it lets the lease lapse, and stops renewing
        working.check()  # its progress (a changing probe, no step of its own) kept it renewed
        with pytest.raises(LeaseLostError, match="made no progress for"):
            hung.check()
        successor = WriterLease(settings.client("s3"), settings.bucket, "library.orders", "the next writer", ttl_seconds=3.0)
        successor.acquire(wait_seconds=8.0)
        successor.release()
    finally:
        working.release()
        hung.release()


def test_a_job_commits_only_while_its_launching_run_holds_the_lease(spark, settings):
    """The orders load job on EMR Serverless reads the lease through its own file system before its MERGE."""
    from dataclasses import replace

    from ddb_athena.exported.orders_load_job import WriterLeaseLost, still_the_writer
    from ddb_athena.exported.partition_load import ExportLoadRequest, ExportUpkeep, load_export_partition

    launcher = lease(settings, "Dagster run 5678 (orders_daily)", ttl=30.0)
    uri = f"s3a://{settings.bucket}/{launcher.key}"
    request = ExportLoadRequest(
        "orders",
        "library.orders",
        "lake",
        [],
        "s3a://b/q",
        datetime.now(UTC),
        ExportUpkeep(1, 1, 1),
        datetime.now(UTC),
        writer_lease={"uri": uri, "holder": "Dagster run 5678 (orders_daily)", "ttl_seconds": 30.0},
        writer_token=launcher.token,
    )
    with pytest.raises(WriterLeaseLost, match="nobody holds it"):
        still_the_writer(spark, request)
    launcher.acquire()
    try:
        still_the_writer(spark, request)
        other = replace(request, writer_lease={**request.writer_lease, "holder": "Dagster run 9999 (orders_daily)"})
        with pytest.raises(WriterLeaseLost, match="held by Dagster run 5678"):
            still_the_writer(spark, other)
    finally:
        launcher.release()
    # A job that starts after its run died, the lease since taken by a re-execution: it stops before it takes the
    # table (the fence on main would otherwise come before its only lease check).
    reexecution = lease(settings, "Dagster run 9999 (orders_daily)", ttl=30.0)
    reexecution.acquire()
    try:
        with pytest.raises(WriterLeaseLost, match="held by Dagster run 9999"):
            load_export_partition(spark, request, before_commit=lambda: still_the_writer(spark, request))
        if spark.catalog.tableExists("library.orders"):
            assert spark.sql("SELECT count(*) FROM library.orders.refs WHERE name LIKE 'writer_%'").first()[0] == 0
    finally:
        reexecution.release()
    # Another holding under the same holder's name (the run's lease taken over, then taken again): not this job's.
    again = lease(settings, "Dagster run 5678 (orders_daily)", ttl=30.0)
    again.acquire()
    try:
        with pytest.raises(WriterLeaseLost, match="held by Dagster run 5678"):
            still_the_writer(spark, request)
    finally:
        again.release()


def test_a_writer_waiting_for_a_job_it_launched_keeps_its_lease_though_it_makes_no_progress_itself(settings):
    """The orders load on EMR Serverless or by spark-submit: the job's platform bounds it, with its own timeout."""
    clock, nothing = FakeClock(), CountedProbe()
    waiting = lease(settings, "a run waiting for its EMR Serverless job", ttl=3.0, stall_seconds=4.0, clock=clock, progress=nothing)
    waiting.acquire()
    try:
        with waiting.progress_elsewhere():
            clock.sleep(8.0)  # twice the stall limit, by its clock
            nothing.wait(2)  # its renewer has judged it since, and renewed
        waiting.check()
    finally:
        waiting.release()


def test_a_progress_probe_that_fails_neither_stops_the_renewals_nor_counts_as_progress(settings):
    def stopped_session():
        raise RuntimeError("the SparkSession is stopping")

    # A time to live of 3 s: renewed every second, judged late after 2 by its clock.
    clock, failing = FakeClock(), CountedProbe(stopped_session)
    holder = lease(settings, "a writer whose Spark is stopping", ttl=3.0, stall_seconds=4.0, clock=clock, progress=failing)
    holder.acquire()
    try:
        for _ in range(3):  # 4.5 s of steps of its own, past the stall limit: renewed all along, whatever the probe says
            clock.sleep(1.5)
            failing.wait()
            holder.check()
        clock.sleep(6.0)  # then none: stalled, though the probe only ever failed
        holder._renewer.join(timeout=10.0)  # it lets the lease lapse, and stops renewing
        with pytest.raises(LeaseLostError, match="made no progress"):
            holder.check()
    finally:
        holder.release()


class RenewalsFailing:
    """An S3 client whose writes fail once the lease is taken (an endpoint that stopped answering)."""

    def __init__(self, s3):
        self._s3, self.failing, self.failures = s3, False, 0

    def put_object(self, **kwargs):
        if self.failing:
            self.failures += 1
            raise ConnectionError("S3 did not answer within the read timeout")
        return self._s3.put_object(**kwargs)

    def __getattr__(self, name):
        return getattr(self._s3, name)


def test_a_lease_left_unrenewed_says_why_its_last_renewal_failed(settings):
    s3, clock = RenewalsFailing(settings.client("s3")), FakeClock()
    holder = WriterLease(s3, settings.bucket, "library.books", "a writer cut off from S3", ttl_seconds=1.5, clock=clock)
    holder.acquire()
    s3.failing = True
    try:
        wait_for(lambda: s3.failures >= 2, "two failed renewals")  # every 0.5 s; the first one's error is kept by the second
        clock.sleep(1.5)  # unrenewed for more than two thirds of the time to live, by its clock
        with pytest.raises(LeaseLostError, match="last renewal: ConnectionError: S3 did not answer within the read timeout"):
            holder.check()
    finally:
        s3.failing = False
        holder.release()


@pytest.mark.parametrize("ahead_seconds", [-120, 120])
def test_a_writer_whose_clock_is_off_s3s_commits_nothing_and_one_a_little_off_goes_on(settings, ahead_seconds):
    """Iceberg dates each commit by the writer's clock and refuses any commit dated more than a minute before the newest:
    a writer minutes ahead (the fault harness's `faketime` Materialize, +517 s) blocked the live sync for as long. Each
    renewal's answer carries S3's clock: a writer more than MAX_CLOCK_SKEW_SECONDS off stops before it commits."""
    off = lease(settings, "a host whose clock is off", ttl=3.0, wall_clock=lambda: datetime.now(UTC) + timedelta(seconds=ahead_seconds))
    off.acquire()
    try:
        assert abs(off.clock_ahead_seconds - ahead_seconds) < 5
        with pytest.raises(ClockSkewError, match=rf"clock is {ahead_seconds:+d} s off S3's|clock is [+-]\d+ s off S3's"):
            off.check()
    finally:
        off.release()
    close = lease(settings, "a host a little off", ttl=3.0, wall_clock=lambda: datetime.now(UTC) + timedelta(seconds=MAX_CLOCK_SKEW_SECONDS / 2))
    close.acquire()
    try:
        close.check()
    finally:
        close.release()
