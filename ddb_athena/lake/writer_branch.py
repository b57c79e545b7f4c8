"""The fence of a table's writer, in Iceberg's own commit: a writer that lost its lease can no longer change the table.

A lease check before a commit leaves a window (a paused process, a GC pause, a job outliving its run) in which a
writer whose lease was taken still commits. So a writer never commits to `main`, the branch readers (Athena) see:
it writes to a branch of its own, `writer_<token>`, created from `main`, and publishes each commit by fast-forwarding
`main` to it (Iceberg's `fast_forward` procedure). Iceberg refuses a fast-forward unless `main` is still an ancestor
of the branch, and commits it by the catalog's compare-and-swap of the metadata pointer: it is atomic. When that
compare-and-swap loses to another commit to the table (any branch's), the procedure fails without looking again, so
the writer calls it again on the fresh table (FAST_FORWARD_ATTEMPTS). A writer that takes a table first moves `main` (an empty commit that names it, the
fence) and branches from there; from then on no older writer's branch descends from `main`, and its fast-forward
fails with WriterFencedError whenever it resumes. The table's readers never see an unpublished branch commit.

The take is fenced too. Each holding of the lease has an epoch, one more than the holding before it
(lib/writer_lease.py), and its fence carries it. A writer takes a table only while the newest fence on `main` is not
newer than its own, and it commits its fence by the same compare-and-swap: on a branch created at the `main` it read,
then `main` fast-forwarded to it. So a writer paused past its lease between its last lease check and its take (or a
job on EMR that starts after its run died) finds its successor's fence, or fails to move `main` past it, and changes
nothing readers see.

A writer branch is dropped by its own writer when it ends; one left by a writer that died expires with its head
snapshot after BRANCH_RETENTION_DAYS (no other writer drops it: a commit to a dropped branch would create it again
from `main`, and that commit could then be published). Upkeep that rewrites files on `main` (compaction, expiry) is
done by the writer between its cycles, only while no newer holding has fenced the table (`check_fence`); the branch
then follows `main` (`follow_main`). An older writer's upkeep that lands on `main` between a live writer's take and
its publication costs the live writer a redo of its idempotent work (MainMovedError, `retried_when_main_moved`), not
its run. No Dagster here.
"""

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from pyspark.sql import SparkSession

from ddb_athena.lake.commit_properties import COMMIT_CONFLICT, empty_commit, iceberg_table, newest_published, newest_published_of
from ddb_athena.lake.identifiers import dotted_name, string_literal, validate_identifier

BRANCH_PREFIX = "writer_"
# Longer than any pause a writer survives (its own run's maximum runtime is an hour and ten minutes); it bounds what
# a dead writer's branch keeps alive. A stale branch's commits are never published: see the module's docstring.
BRANCH_RETENTION_DAYS = 7
# The summary properties of a fence commit: which writer took the table (for the snapshot history), and its epoch.
FENCE_SUMMARY_PROPERTY = "ddb_athena.writer-fence"
FENCE_EPOCH_PROPERTY = "ddb_athena.writer-epoch"
# A take retried when `main` moved between its read and its fence (an older writer's commit it then finds refused).
TAKE_ATTEMPTS = 5
# A fast-forward retried when the catalog's compare-and-swap lost to another commit to the table (any branch's): the
# procedure re-applies its update to the stale metadata it started from and fails (Iceberg's BaseTransaction raises
# PendingUpdateFailedException), so the writer calls it again on the fresh table, which checks the ancestry again.
FAST_FORWARD_ATTEMPTS = 5
FAST_FORWARD_RETRY_SECONDS = 0.2


class WriterFencedError(RuntimeError):
    """Another writer took the table since this one branched: nothing of this writer's is published."""


class MainMovedError(WriterFencedError):
    """`main` moved past this writer's fence, but by no newer writer (an older one's upkeep, which commits to `main`):
    this writer still holds the table. Its unpublished commits are dropped, and its next write takes the table again."""


Result = TypeVar("Result")


def retried_when_main_moved(work: Callable[[], Result], warn: Callable[[str], None]) -> Result:
    """`work` (idempotent: an insert-only load, maintenance) done again when an older writer's upkeep moved `main`
    under it (MainMovedError): the writer still holds the table and takes it again. Not a run lost to an old writer."""
    attempt = 1
    while True:
        try:
            return work()
        except MainMovedError as error:
            if attempt == TAKE_ATTEMPTS:
                raise
            warn(f"{error} (attempt {attempt} of {TAKE_ATTEMPTS})")
            attempt += 1


class WriterBranch:
    """One writer's branch of each of `tables` (namespace.table names), taken on first use."""

    def __init__(self, spark: Callable[[], SparkSession], catalog: str, tables: Sequence[str], token: str, epoch: int, carried: Sequence[str] = ()):
        """`token` and `epoch`: the lease holding this writer writes under. `carried`: summary properties the fence
        commit repeats from the newest published snapshot that has them (the stream positions: snapshot expiry counts
        the fence among the newer snapshots, never a reason to lose them)."""
        self._spark, self._carried, self.epoch = spark, tuple(carried), epoch
        self.catalog = validate_identifier(catalog, "catalog name")
        self.tables = tuple(dotted_name(table) for table in tables)
        self.name = validate_identifier(f"{BRANCH_PREFIX}{token}", "writer branch")
        self._taken: set[str] = set()
        # Fast-forwards called again after a commit conflict (an operator's figure: how often writers meet).
        self.fast_forwards_retried = 0

    @property
    def commit_properties(self) -> dict[str, str]:
        """What each of this writer's commits carries: its epoch (the take compares it with its own)."""
        return {FENCE_EPOCH_PROPERTY: str(self.epoch)}

    def ref(self, table: str) -> str:
        """`table`'s name in SQL reads and writes of this writer: its branch once taken, `main` before."""
        table = dotted_name(table)
        return f"{table}.branch_{self.name}" if table in self._taken else table

    def take(self, table: str) -> None:
        """Fences `table` (an empty commit that `main` fast-forwards to) and writes on the branch it heads from then on;
        WriterFencedError if a newer holding has fenced it. The table must exist."""
        table = dotted_name(table)
        if table in self._taken:
            return
        if table not in self.tables:
            raise ValueError(f"{table} is not among this writer's tables {self.tables}")
        spark = self._spark()
        for _ in range(TAKE_ATTEMPTS):
            loaded = iceberg_table(spark, table)
            loaded.refresh()
            if loaded.currentSnapshot() is None:
                empty_commit(spark, table, {})  # a table never written: a snapshot to branch from
                continue
            published = newest_published_of(spark, table, (FENCE_EPOCH_PROPERTY, *self._carried))
            newest = published.pop(FENCE_EPOCH_PROPERTY, None)
            self._refuse_if_newer(table, newest, "this writer changes nothing")
            head = loaded.currentSnapshot().snapshotId()
            spark.sql(f"ALTER TABLE {table} CREATE OR REPLACE BRANCH {self.name} AS OF VERSION {head} RETAIN {BRANCH_RETENTION_DAYS} DAYS")
            empty_commit(spark, table, {**published, **self.commit_properties, FENCE_SUMMARY_PROPERTY: self.name}, branch=self.name)
            self._taken.add(table)
            try:
                self.publish(table)  # main moves to the fence only if it is still where this writer read it
                return
            except WriterFencedError:
                self._taken.discard(table)  # main moved meanwhile: read it again
        raise WriterFencedError(f"{table}: main kept moving while this writer took it ({TAKE_ATTEMPTS} attempts); this writer changes nothing")

    def check_fence(self) -> None:
        """WriterFencedError if a newer holding has fenced any of this writer's tables: called before upkeep, which
        commits to `main` itself (a rewrite on a branch could not be published over the live writer's commits)."""
        for table in self.tables:
            self._refuse_if_newer(table, newest_published(self._spark(), table, FENCE_EPOCH_PROPERTY), "this writer's upkeep does not run")

    def _refuse_if_newer(self, table: str, newest_epoch: str | None, consequence: str) -> None:
        if newest_epoch is not None and int(newest_epoch) > self.epoch:
            raise WriterFencedError(
                f"{table}: a newer writer (epoch {newest_epoch}) has taken the table since this one's lease (epoch {self.epoch}); {consequence}"
            )

    def take_all(self) -> None:
        for table in self.tables:
            self.take(table)

    def publish(self, table: str) -> None:
        """Makes this writer's commits to `table` visible: `main` fast-forwards to the branch, or WriterFencedError."""
        self._fast_forward(table, "main", self.name)

    def follow_main(self, table: str) -> None:
        """After this writer's own upkeep committed to `main` (compaction, expiry): the branch moves up to it."""
        self._fast_forward(table, self.name, "main")

    def _fast_forward(self, table: str, branch: str, to: str) -> None:
        table = dotted_name(table)
        if table not in self._taken:
            return
        call = f"CALL {self.catalog}.system.fast_forward(table => {string_literal(table)}, branch => {string_literal(branch)}, to => {string_literal(to)})"
        for attempt in range(1, FAST_FORWARD_ATTEMPTS + 1):
            try:
                self._spark().sql(call).collect()
                return
            except Exception as error:  # noqa: BLE001 - Spark wraps Iceberg's refusal; anything else is re-raised
                if COMMIT_CONFLICT in str(error) and attempt < FAST_FORWARD_ATTEMPTS:
                    self.fast_forwards_retried += 1
                    time.sleep(FAST_FORWARD_RETRY_SECONDS * attempt)
                    continue
                if "is not an ancestor of" not in str(error):
                    raise
                self._refused(table, branch)

    def _refused(self, table: str, branch: str) -> None:
        """Iceberg refused to fast-forward `branch` (called while its error is handled: that context is dropped)."""
        newest = newest_published(self._spark(), table, FENCE_EPOCH_PROPERTY) if branch == "main" else None
        if branch == "main" and (newest is None or int(newest) <= self.epoch):
            self._taken.discard(table)
            raise MainMovedError(
                f"{table}: main moved since {self.name} branched from it, by no newer writer (an older writer's upkeep); "
                "this writer's unpublished commits are dropped, and it takes the table again"
            ) from None
        raise WriterFencedError(
            f"{table}: another writer has committed since {self.name} branched from main; this writer's commits are not published"
        ) from None

    def drop(self) -> None:
        """When the writer ends: its branch is no longer needed (every commit on it was published or refused)."""
        for table in sorted(self._taken):
            self._spark().sql(f"ALTER TABLE {table} DROP BRANCH IF EXISTS {self.name}")
        self._taken.clear()
