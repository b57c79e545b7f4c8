"""One writer per table, whoever starts it: a lease object in S3, taken and renewed with conditional writes.

Dagster's pool keeps the runs of one instance from overlapping; the lease also stops what the pool cannot see (a
`dagster asset materialize` in its own process, another Dagster instance, an EMR Serverless job): a writer takes
the lease before its first write (`If-None-Match: *`), renews it while it lives (`If-Match` on its own ETag), checks
it before every commit, and deletes it when done (`If-Match`, so it never deletes a successor's).

A holder that dies, or stops making progress, stops renewing. Expiry is judged by S3's clock alone: the lease is
expired once S3's own time (the `Date` of its answer) is more than `ttl_seconds` past the lease object's
`Last-Modified` (set by S3 when the holder last renewed), so hosts whose clocks disagree judge it alike. It is then
taken over with `If-Match` on that ETag (of two contenders, one wins). Each holding has a token, written in the
lease: a renewal whose response was lost and whose retry S3 refused (the ETag had changed, by that very renewal) is
recognised as this holder's own and not mistaken for a takeover.

The lease stops a writer before its next step; a commit already in flight is stopped by the table itself
(lake/writer_branch.py: the new writer's fence refuses the old one's publication). No Dagster here.
"""

import email.utils
import json
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from botocore.exceptions import ClientError

from ddb_athena.lib.declarations import declared_tables
from ddb_athena.lib.lease_record import describe_holder, epoch_of, lease_body, lease_key

# Every run that writes a table is in that table's pool, which dagster.yaml limits to one run at a time: Materialize,
# a backfill or a re-execution queues behind the running writer. The lease below stops the writers the queue does
# not see.
# (Both assets of an exported table are in its pool: a backfill's partitions run one after the other, so on a table
# never loaded the first pays for the full export and the others find it loaded.) Each table's is `<name>_writer`
# (lib/declarations.py).
WRITER_POOLS = tuple(table.writer_pool for table in declared_tables().values())

# Renewals per lifetime: a holder survives two failed renewals in a row (a slow or throttled request).
RENEWALS_PER_TTL = 3
# Iceberg dates each commit by the writer's clock and refuses any commit dated more than a minute before the newest
# one: a writer whose clock runs ahead would block every other writer for as long as it is ahead. A writer commits
# only while its clock is within this of S3's (the `Date` of each renewal's answer).
MAX_CLOCK_SKEW_SECONDS = 30.0
POLL_SECONDS = 2.0


class LeaseHeldError(RuntimeError):
    """Another writer holds the table's lease."""


class ClockSkewError(RuntimeError):
    """This host's clock is too far from S3's for a commit that other writers' commits must follow."""


class LeaseLostError(RuntimeError):
    """This writer's lease was taken over or could not be renewed in time: it must not commit."""


@dataclass(frozen=True)
class LeaseState:
    etag: str
    holder: str
    body: dict
    # By S3's clock: from the lease's last write to S3's answer to this read.
    age_seconds: float

    @property
    def released(self) -> bool:
        return bool(self.body.get("released"))

    @property
    def epoch(self) -> int:
        return epoch_of(self.body)


def _precondition_failed(error: ClientError) -> bool:
    code = error.response.get("Error", {}).get("Code", "")
    return code in ("PreconditionFailed", "412", "ConditionalRequestConflict") or error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412)


def _not_found(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code", "") in ("NoSuchKey", "404", "NotFound")


class WriterLease:
    """The lease of one table. `acquire()`, then `check()` before each commit, then `release()`; or `with lease:`."""

    def __init__(
        self,
        s3,
        bucket: str,
        table: str,
        holder: str,
        ttl_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        stall_seconds: float | None = None,
        progress: Callable[[], object] = lambda: None,
    ):
        """`wall_clock` only dates the record for people; expiry is S3's. With `stall_seconds`, renewals stop once the
        writer has made no progress for that long: neither a step (`progressed()`, `check()`) nor a change of what
        `progress()` returns (e.g. Spark's completed tasks), so a hung writer's lease expires."""
        if ttl_seconds <= 0:
            raise ValueError(f"a lease's time to live must be positive, got {ttl_seconds}")
        if stall_seconds is not None and stall_seconds < ttl_seconds:
            raise ValueError(f"a writer's stall limit ({stall_seconds:g} s) must be at least its lease's time to live ({ttl_seconds:g} s)")
        self._s3, self.bucket, self.table, self.holder = s3, bucket, table, holder
        self.key = lease_key(table)
        self.ttl_seconds, self.stall_seconds = ttl_seconds, stall_seconds
        # This holding's identity in the lease (a branch of the table is named after it too: lake/writer_branch.py).
        self.token = uuid.uuid4().hex[:16]
        # This holding's place in the order of the table's holdings, set when it takes the lease (writer_branch.py
        # refuses a fence older than the newest on main).
        self.epoch: int | None = None
        self._clock, self._sleep, self._wall_clock, self._progress = clock, sleep, wall_clock, progress
        self._etag: str | None = None
        self._renewed_at: float | None = None
        self._lost: str | None = None
        self._progressed_at = clock()
        self._progress_seen: object = None
        self._elsewhere = False
        # Why the last renewal failed, if it did: said when the lease has gone unrenewed too long.
        self._renewal_error: str | None = None
        # How far this host's clock is ahead of S3's (negative: behind), from the last write of the lease.
        self.clock_ahead_seconds = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _put(self, epoch: int, released: bool = False, **condition) -> str:
        written_at = self._wall_clock()
        body = lease_body(self.holder, self.table, self.ttl_seconds, written_at, self.token, epoch, released)
        response = self._s3.put_object(Bucket=self.bucket, Key=self.key, Body=body, ContentType="application/json", **condition)
        date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        if date:
            self.clock_ahead_seconds = (written_at - email.utils.parsedate_to_datetime(date)).total_seconds()
        return response["ETag"]

    def read(self) -> LeaseState | None:
        """The lease as it is in S3, or None when nobody holds it."""
        try:
            response = self._s3.get_object(Bucket=self.bucket, Key=self.key)
        except ClientError as error:
            if _not_found(error):
                return None
            raise
        try:
            body = json.loads(response["Body"].read())
        except ValueError:
            body = {}
        s3_now = email.utils.parsedate_to_datetime(response["ResponseMetadata"]["HTTPHeaders"]["date"])
        return LeaseState(response["ETag"], describe_holder(body), body, (s3_now - response["LastModified"]).total_seconds())

    def _ours(self, state: LeaseState | None) -> bool:
        """Written by this holding: a conditional write refused because an earlier attempt of it had succeeded."""
        return state is not None and state.body.get("token") == self.token

    def try_acquire(self) -> bool:
        """One attempt: creates the lease, or takes over one that S3's clock says has expired."""
        requested_at = self._clock()
        try:
            self._taken(self._put(1, IfNoneMatch="*"), requested_at, 1)  # the table's first lease
            return True
        except ClientError as error:
            if not _precondition_failed(error):
                raise
        state = self.read()
        if state is None:
            return False  # deleted (by a writer of before the epochs) between the two requests: the next attempt creates it
        if self._ours(state):
            self._taken(state.etag, requested_at, state.epoch)  # the write succeeded; its response was lost and the retry refused
            return True
        if not state.released and state.age_seconds <= self.ttl_seconds:
            return False
        epoch, requested_at = state.epoch + 1, self._clock()
        try:
            self._taken(self._put(epoch, IfMatch=state.etag), requested_at, epoch)  # released, or expired: its holder stopped renewing
            return True
        except ClientError as error:
            if not (_precondition_failed(error) or _not_found(error)):
                raise
        state = self.read()  # renewed, released or taken by another contender meanwhile, or by this very request
        if self._ours(state):
            self._taken(state.etag, requested_at, state.epoch)
            return True
        return False

    def acquire(self, wait_seconds: float | None = None) -> None:
        """Takes the lease, waiting up to `wait_seconds` (default: twice its time to live, long enough for a dead
        holder's lease to expire); raises LeaseHeldError naming the holder if it is still held then."""
        wait = 2 * self.ttl_seconds if wait_seconds is None else wait_seconds
        deadline = self._clock() + wait
        while not self.try_acquire():
            if self._clock() >= deadline:
                state = self.read()
                holder = state.holder if state else "a writer that has just released it"
                raise LeaseHeldError(
                    f"{self.table} has another writer: {holder} (lease s3://{self.bucket}/{self.key}). This writer waited "
                    f"{wait:g} s and stops without writing; a live writer renews its lease every {self.ttl_seconds / RENEWALS_PER_TTL:g} s, "
                    f"a dead one's lease expires {self.ttl_seconds:g} s after its last renewal."
                )
            self._sleep(min(POLL_SECONDS, max(0.0, deadline - self._clock())))
        self._start_renewing()

    def _taken(self, etag: str, requested_at: float, epoch: int | None = None) -> None:
        # From when the request was sent: the lease in S3 is at least that fresh, and check() errs on the safe side.
        with self._lock:
            self._etag, self._renewed_at, self._lost = etag, requested_at, None
            if epoch is not None:
                self.epoch = epoch

    def renew(self) -> None:
        """Extends the lease (If-Match on this holder's last ETag); raises LeaseLostError if another took it."""
        with self._lock:
            if self._etag is None:
                raise LeaseLostError(f"{self.table}: this writer does not hold the lease")
            etag = self._etag
        requested_at = self._clock()
        try:
            self._taken(self._put(self.epoch or 0, IfMatch=etag), requested_at)
        except ClientError as error:
            if not (_precondition_failed(error) or _not_found(error)):
                raise
            state = self.read()
            if self._ours(state):
                self._taken(state.etag, requested_at)  # this renewal landed; its response was lost and the retry refused
                return
            self._lose(f"taken over by {state.holder if state else 'nobody (deleted)'}")
            raise LeaseLostError(f"{self.table}: the writer lease was {self._lost}") from None

    def _lose(self, reason: str) -> None:
        with self._lock:
            self._etag, self._lost = None, reason

    def progressed(self) -> None:
        """The writer made progress (a step, a page, a cycle): renewals go on."""
        self._progressed_at = self._clock()

    @contextmanager
    def progress_elsewhere(self):
        """While a job this writer launched does the work elsewhere (a spark-submit job, EMR Serverless: bounded by its
        own timeout and the run's), the writer counts as making progress."""
        self._elsewhere = True
        try:
            yield
        finally:
            self._elsewhere = False
            self.progressed()

    def _stalled_for(self) -> float:
        if self._elsewhere:
            self.progressed()
        try:
            seen = self._progress()
        except Exception:  # noqa: BLE001 - a probe that cannot answer (a session stopping) tells no progress, and no hang
            seen = self._progress_seen
        if seen != self._progress_seen:
            self._progress_seen = seen
            self.progressed()
        return self._clock() - self._progressed_at

    def check(self) -> None:
        """Before each step that writes: raises LeaseLostError unless this writer holds a lease renewed within its time
        to live, with a third of it to spare (a contender cannot have taken it over yet). A step is progress."""
        self.progressed()
        with self._lock:
            lost, renewed_at = self._lost, self._renewed_at
        if lost:
            raise LeaseLostError(f"{self.table}: the writer lease was {lost}; this writer stops without committing")
        if abs(self.clock_ahead_seconds) > MAX_CLOCK_SKEW_SECONDS:
            raise ClockSkewError(
                f"{self.table}: this host's clock is {self.clock_ahead_seconds:+.0f} s off S3's (more than {MAX_CLOCK_SKEW_SECONDS:g} s): Iceberg dates "
                "each commit by it, and one dated ahead would block every other writer until then; this writer stops without committing. "
                "Set the host's clock right (NTP)"
            )
        if renewed_at is None or self._clock() - renewed_at > self.ttl_seconds * (1 - 1 / RENEWALS_PER_TTL):
            raise LeaseLostError(
                f"{self.table}: the writer lease has not been renewed for {self._clock() - (renewed_at or 0):.0f} s "
                f"(time to live {self.ttl_seconds:g} s{'; last renewal: ' + self._renewal_error if self._renewal_error else ''}); "
                "this writer stops without committing"
            )

    def _start_renewing(self) -> None:
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew_until_stopped, name=f"lease-{self.table}", daemon=True)
        self._renewer.start()

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(self.ttl_seconds / RENEWALS_PER_TTL):
            if self.stall_seconds is not None:
                stalled = self._stalled_for()
                if stalled > self.stall_seconds:
                    # A hung writer must not hold the table: its lease expires and the next writer takes it.
                    self._lose(f"left to expire: this writer made no progress for {stalled:.0f} s (stall limit {self.stall_seconds:g} s)")
                    return
            try:
                self.renew()
            except LeaseLostError:
                return
            except Exception as error:  # noqa: BLE001 - a failed request: the next one may pass; check() tells if none does
                self._renewal_error = f"{type(error).__name__}: {error}"
                continue
            self._renewal_error = None

    def release(self) -> None:
        """Stops renewing and marks the lease released if it is still this writer's (kept, so that the next holding's
        epoch follows this one's)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        with self._lock:
            etag, self._etag = self._etag, None
        if etag is None:
            return
        try:
            self._put(self.epoch or 0, released=True, IfMatch=etag)
        except ClientError as error:
            if not (_precondition_failed(error) or _not_found(error)):
                raise

    def __enter__(self) -> "WriterLease":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
