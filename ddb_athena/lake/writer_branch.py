"""The fence of a table's writer, in Iceberg's own commit: a writer that lost its lease can no longer change the table.

A lease check before a commit leaves a window (a paused process, a GC pause, a job outliving its run) in which a
writer whose lease was taken still commits. So a writer never commits to `main`, the branch readers (Athena) see:
it writes to a branch of its own, `writer_<token>`, created from `main`, and publishes each commit by fast-forwarding
`main` to it (Iceberg's `fast_forward` procedure). Iceberg refuses a fast-forward unless `main` is still an ancestor
of the branch, and checks that again on the fresh table state if the catalog's compare-and-swap of the metadata
pointer fails: it is atomic. A writer that takes a table first moves `main` (an empty commit that names it, the
fence) and branches from there; from then on no older writer's branch descends from `main`, and its fast-forward
fails with WriterFencedError whenever it resumes. The table's readers never see an unpublished branch commit.

A writer branch is dropped by its own writer when it ends; one left by a writer that died expires with its head
snapshot after BRANCH_RETENTION_DAYS (no other writer drops it: a commit to a dropped branch would create it again
from `main`, and that commit could then be published). Upkeep that rewrites files on `main` (compaction, expiry) is
done by the writer between its cycles; the branch then follows `main` (`follow_main`). No Dagster here.
"""

from collections.abc import Callable, Sequence

from pyspark.sql import SparkSession

from ddb_athena.lake.commit_properties import empty_commit, newest_published
from ddb_athena.lake.identifiers import dotted_name, string_literal, validate_identifier

BRANCH_PREFIX = "writer_"
# Longer than any pause a writer survives (its own run's maximum runtime is an hour and ten minutes); it bounds what
# a dead writer's branch keeps alive. A stale branch's commits are never published: see the module's docstring.
BRANCH_RETENTION_DAYS = 7
# The summary property of a fence commit: which writer took the table, for the snapshot history.
FENCE_SUMMARY_PROPERTY = "ddb_athena.writer-fence"


class WriterFencedError(RuntimeError):
    """Another writer took the table since this one branched: nothing of this writer's is published."""


class WriterBranch:
    """One writer's branch of each of `tables` (namespace.table names), taken on first use."""

    def __init__(self, spark: Callable[[], SparkSession], catalog: str, tables: Sequence[str], token: str, carried: Sequence[str] = ()):
        """`carried`: summary properties the fence commit repeats from the newest published snapshot that has them
        (the stream positions: snapshot expiry counts the fence among the newer snapshots, never a reason to lose them)."""
        self._spark, self._carried = spark, tuple(carried)
        self.catalog = validate_identifier(catalog, "catalog name")
        self.tables = tuple(dotted_name(table) for table in tables)
        self.name = validate_identifier(f"{BRANCH_PREFIX}{token}", "writer branch")
        self._taken: set[str] = set()

    def ref(self, table: str) -> str:
        """`table`'s name in SQL reads and writes of this writer: its branch once taken, `main` before."""
        table = dotted_name(table)
        return f"{table}.branch_{self.name}" if table in self._taken else table

    def take(self, table: str) -> None:
        """Fences `table` (an empty commit on `main`) and creates this writer's branch from it. The table must exist."""
        table = dotted_name(table)
        if table in self._taken:
            return
        if table not in self.tables:
            raise ValueError(f"{table} is not among this writer's tables {self.tables}")
        spark = self._spark()
        carried = {name: value for name in self._carried if (value := newest_published(spark, table, name)) is not None}
        empty_commit(spark, table, {**carried, FENCE_SUMMARY_PROPERTY: self.name})
        spark.sql(f"ALTER TABLE {table} CREATE OR REPLACE BRANCH {self.name} RETAIN {BRANCH_RETENTION_DAYS} DAYS")
        self._taken.add(table)

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
        try:
            self._spark().sql(
                f"CALL {self.catalog}.system.fast_forward(table => {string_literal(table)}, branch => {string_literal(branch)}, to => {string_literal(to)})"
            ).collect()
        except Exception as error:  # noqa: BLE001 - Spark wraps Iceberg's refusal; anything else is re-raised
            if "is not an ancestor of" not in str(error):
                raise
            raise WriterFencedError(
                f"{table}: another writer has committed since {self.name} branched from main; this writer's commits are not published"
            ) from None

    def drop(self) -> None:
        """When the writer ends: its branch is no longer needed (every commit on it was published or refused)."""
        for table in sorted(self._taken):
            self._spark().sql(f"ALTER TABLE {table} DROP BRANCH IF EXISTS {self.name}")
        self._taken.clear()
