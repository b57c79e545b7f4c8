"""Iceberg table upkeep with Spark procedures: compaction, snapshot expiry, orphan files, tombstone pruning.

Snapshots are expired only once older than a retention that exceeds the longest query (at least an
hour), so a reader that planned its scan on an older snapshot can always read it to the end; files
that no snapshot references are removed only once older than a day, so a write still in flight is never
taken for an orphan. Old metadata files go at each commit (the tables' `write.metadata.*` properties).
"""

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from pyspark.sql import SparkSession

from ddb_athena.lake.change_merge import STREAM_POSITIONS_PROPERTY, table_properties, tombstone_table
from ddb_athena.lake.commit_properties import branch_summary, iceberg_table, newest_carriers_committed_at
from ddb_athena.lake.identifiers import dotted_name, validate_identifier
from ddb_athena.lake.table_spec import TARGET_FILE_BYTES, set_properties_sql, timestamp_literal
from ddb_athena.lake.writer_branch import FENCE_EPOCH_PROPERTY, WriterBranch

# Floors: the longest query we document (Athena's DML queries time out after 30 minutes by default), and the
# age below which a file may belong to a commit still being written.
MIN_SNAPSHOT_RETENTION = timedelta(hours=1)
MIN_ORPHAN_AGE = timedelta(days=1)
# Only files under this share of the target are rewritten for their size (Iceberg's default, 3/4, took in the files
# its own rewrite leaves: a table's bytes split evenly over its output files leave them all under 3/4 of the target
# unless the table is a multiple of it, so a 1 GB table was rewritten whole at every compaction, ~50 s within half a
# vCPU); and none for being big (a reader splits a big file at its 128 MB split size anyway).
SMALL_FILE_SHARE = 4
NEVER_TOO_BIG_BYTES = 2**50


# What expiry never loses: the epoch of the newest writer (which refuses an older writer's take) and the stream
# positions a sync resumes from.
KEPT_SUMMARY_PROPERTIES = (FENCE_EPOCH_PROPERTY, STREAM_POSITIONS_PROPERTY)

MAINTAINED_AT_PROPERTY = "ddb_athena.maintained-at"
ORPHANS_REMOVED_AT_PROPERTY = "ddb_athena.orphans-removed-at"
TOMBSTONES_PRUNED_AT_PROPERTY = "ddb_athena.tombstones-pruned-at"


class MaintenanceSettingsError(ValueError):
    """A retention below its floor: expiring or deleting that early could fail running queries or writes."""


def check_floors(snapshot_retention: timedelta, orphan_age: timedelta, retain_last: int) -> None:
    if snapshot_retention < MIN_SNAPSHOT_RETENTION:
        raise MaintenanceSettingsError(
            f"snapshot retention {snapshot_retention} is shorter than {MIN_SNAPSHOT_RETENTION}: a query planned on an "
            "expired snapshot would fail (HIVE_CANNOT_OPEN_SPLIT); keep it longer than the longest query"
        )
    if orphan_age < MIN_ORPHAN_AGE:
        raise MaintenanceSettingsError(f"orphan file age {orphan_age} is under {MIN_ORPHAN_AGE}: files of a commit still being written could be deleted")
    if retain_last < 1:
        raise MaintenanceSettingsError(f"retain_last {retain_last}: at least the current snapshot is kept (1)")


@dataclass(frozen=True)
class TableFiles:
    """What a table's current state and history hold."""

    data_files: int
    # Of its data and delete files (Iceberg's total-files-size; compaction leaves the delete files a small share).
    files_bytes: int
    delete_files: int
    snapshots: int
    # Metadata files of the current state and history: metadata.json versions, a manifest list per snapshot, the
    # current snapshot's manifests.
    metadata_files: int

    @property
    def average_data_file_bytes(self) -> float:
        return self.files_bytes / self.data_files if self.data_files else 0.0


def table_files(spark: SparkSession, target: str) -> TableFiles:
    """From the table's metadata and its current manifest list: one read, no Spark job (the files metadata table read
    every manifest, and the history's every manifest list, at each maintenance pass)."""
    table = iceberg_table(spark, target)
    metadata = table.operations().current()
    snapshot = table.currentSnapshot()
    totals = table_totals(spark, target)
    snapshots = metadata.snapshots().size()
    manifests = snapshot.allManifests(table.io()).size() if snapshot is not None else 0
    versions = metadata.previousFiles().size() + 1
    return TableFiles(totals.data_files, totals.files_bytes, totals.delete_files, snapshots, versions + snapshots + manifests)


@dataclass(frozen=True)
class TableTotals:
    """A table's live files and rows, as Iceberg counts them in every snapshot's summary: reading them costs nothing."""

    data_files: int
    delete_files: int
    records: int
    position_deletes: int
    files_bytes: int

    @classmethod
    def of(cls, summary: dict[str, str]) -> "TableTotals":
        names = ("total-data-files", "total-delete-files", "total-records", "total-position-deletes", "total-files-size")
        return cls(*(int(summary.get(name, 0)) for name in names))

    def surplus_data_files(self, settled: int | None = None) -> int:
        """Data files beyond the `settled` count (what the table held after its last compaction: files it leaves, near
        their target size, are no surplus), or, unknown, beyond what its size needs at TARGET_FILE_BYTES each: every
        sync commit adds a small one."""
        return self.data_files - (settled if settled is not None else max(1, math.ceil(self.files_bytes / TARGET_FILE_BYTES)))

    def compaction_due(self, file_threshold: int, settled: int | None = None) -> bool:
        """Whether a reader now opens `file_threshold` delete files, or as many data files more than it needs."""
        return self.delete_files >= file_threshold or self.surplus_data_files(settled) >= file_threshold

    @property
    def deleted_share(self) -> float:
        """Of the rows in the table's data files, the share its position deletes hide (or did, in files since rewritten:
        counted until the delete files are merged)."""
        return self.position_deletes / max(self.records, 1)


def table_totals(spark: SparkSession, target: str) -> TableTotals:
    return TableTotals.of(branch_summary(spark, target, "main"))


# A reader pays for each delete file (every data file's scan reads the deletes that may apply to it: a sync commit's
# one file spans the whole table) and for the rows those hide; compaction pays for what it rewrites. So delete files
# are merged into one (their own rows only: small), and data files are rewritten for their deleted rows only once
# those reach this share of the table: a busy 1 GB table was otherwise rewritten whole at every pass.
DELETED_SHARE_REWRITE = 0.2
# Past this share a table's deleted rows are rewritten out even when no cycle has the time to spare (one file at least).
DELETED_SHARE_OVERDUE = 2 * DELETED_SHARE_REWRITE
# How fast deleted rows are rewritten out, until a sync run has timed its own: a 1 GB table in ~66 s within half a
# vCPU (docs/performance-log.md, 3 December). It sizes a run's first slice only.
FIRST_REWRITE_BYTES_PER_SECOND = 15 * 1024 * 1024
_NEVER = str(2**31 - 1)


@dataclass
class CompactionResult:
    rewritten_data_files: int
    added_data_files: int
    # Position delete files merged into fewer (without rewriting the data files they apply to).
    rewritten_delete_files: int = 0
    # The table's data files once compacted: the next compaction is due that many files later.
    data_files_after: int | None = None
    # Of the data files rewritten, those rewritten for their deleted rows, and their bytes.
    deleted_rows_files: int = 0
    deleted_rows_bytes: int = 0


def compact(
    spark: SparkSession,
    catalog: str,
    target: str,
    deleted_rows_bytes: int | None = None,
    pack_small_files: bool = True,
    totals: TableTotals | None = None,
) -> CompactionResult:
    """Once the rows deleted reach DELETED_SHARE_REWRITE of the table, data files rewritten without them, oldest first,
    up to `deleted_rows_bytes` of them (every one when None; `rewrite_deleted_rows`); small data files into files of
    about TARGET_FILE_BYTES (with `pack_small_files`); then the position delete files merged into one, which drops the
    positions in the files rewritten. Deleted rows first: a file packed first would be one more they apply to. `totals`:
    the table's, when the caller has just read them."""
    catalog = validate_identifier(catalog, "catalog name")
    table = dotted_name(target)
    totals = totals or table_totals(spark, target)
    deleted = (0, 0, 0)
    if totals.deleted_share >= DELETED_SHARE_REWRITE:
        deleted = rewrite_deleted_rows(spark, target, deleted_rows_bytes, at_least_one=totals.deleted_share >= DELETED_SHARE_OVERDUE)
    packed = (0, 0)
    if pack_small_files:
        row = spark.sql(
            f"CALL {catalog}.system.rewrite_data_files(table => '{table}', options => map("
            f"'min-input-files', '2', 'delete-file-threshold', '{_NEVER}', 'remove-dangling-deletes', 'true', "
            f"'target-file-size-bytes', '{TARGET_FILE_BYTES}', 'min-file-size-bytes', '{TARGET_FILE_BYTES // SMALL_FILE_SHARE}', "
            f"'max-file-size-bytes', '{NEVER_TOO_BIG_BYTES}'))"
        ).collect()[0]
        packed = (row["rewritten_data_files_count"], row["added_data_files_count"])
    merged_deletes = 0
    # Merged when there are several; after data files were rewritten for their deleted rows, rewritten to drop the
    # positions in those files (Iceberg's dangling-delete removal drops only a delete file no live data file is older
    # than: a sync commit's one file spans the table).
    if (pack_small_files and totals.delete_files > 1) or (deleted[0] and totals.delete_files):
        deletes = spark.sql(f"CALL {catalog}.system.rewrite_position_delete_files(table => '{table}', options => map('rewrite-all', 'true'))").collect()[0]
        merged_deletes = deletes["rewritten_delete_files_count"]
    after = table_totals(spark, target).data_files
    return CompactionResult(packed[0] + deleted[0], packed[1] + deleted[2], merged_deletes, after, deleted[0], deleted[1])


def rewrite_deleted_rows(spark: SparkSession, target: str, byte_budget: int | None, at_least_one: bool = False) -> tuple[int, int, int]:
    """The data files that deletes apply to, rewritten without their deleted rows in one commit to `main`, those the
    longest without a rewrite first (the lowest data sequence number: a file this rewrites comes back last, so no file is
    rewritten twice before every other one has been), as many as fit `byte_budget` (all when None; with `at_least_one`,
    the oldest even when it alone is over). Iceberg's rewrite_data_files can cap how many files it takes, not which: it
    took the file it had just written again, first. So the files are chosen here and rewritten the way that procedure
    rewrites a group (a staged scan of them, written as their replacement). -> (files, bytes, files added)"""
    jvm, table = spark._jvm, iceberg_table(spark, target)
    snapshot = table.currentSnapshot()
    if snapshot is None:
        return (0, 0, 0)
    tasks, planned = [], table.newScan().planFiles()
    try:
        iterator = planned.iterator()
        while iterator.hasNext():
            task = iterator.next()
            if not task.deletes().isEmpty():
                tasks.append((task.file().dataSequenceNumber(), task.file().location(), task.file().fileSizeInBytes(), task))
    finally:
        planned.close()
    chosen, total = [], 0
    for _, _, size, task in sorted(tasks, key=lambda entry: entry[:2]):
        if byte_budget is not None and total + size > byte_budget and not (at_least_one and not chosen):
            break
        chosen.append(task)
        total += size
    if not chosen:
        return (0, 0, 0)
    group, staged = str(uuid.uuid4()), jvm.java.util.ArrayList()
    for task in chosen:
        staged.add(task)
    cache, task_sets, coordinator = (_instance(spark, name) for name in ("SparkTableCache", "ScanTaskSetManager", "FileRewriteCoordinator"))
    cache.add(group, table)
    task_sets.stageTasks(table, group, staged)
    try:
        rows = spark.read.format("iceberg").option("scan-task-set-id", group).option("split-size", str(total)).option("file-open-cost", "0").load(group)
        rows.write.format("iceberg").option("rewritten-file-scan-task-set-id", group).option("target-file-size-bytes", str(TARGET_FILE_BYTES)).option(
            "distribution-mode", "none"
        ).mode("append").save(group)
        added = coordinator.fetchNewFiles(table, group)
        # Refused if anything since `snapshot` deleted rows from these files: their rows would come back.
        rewrite = table.newRewrite().validateFromSnapshot(snapshot.snapshotId())
        for task in chosen:
            rewrite.deleteFile(task.file())
        files = added.iterator()
        while files.hasNext():
            rewrite.addFile(files.next())
        rewrite.commit()
        return (len(chosen), total, added.size())
    finally:
        cache.remove(group)
        task_sets.removeTasks(table, group)
        coordinator.clearRewrite(table, group)


def _instance(spark: SparkSession, name: str):
    """The instance of one of Iceberg's Spark singletons (`org.apache.iceberg.spark.<name>.get()`), called through Java's
    reflection: py4j's lookup of a static method takes the first member of that name the JVM lists, and SparkTableCache
    also has an instance `get(String)` (in the cost bench's JVM it came first: "SparkTableCache.get does not exist")."""
    jvm, gateway = spark._jvm, spark.sparkContext._gateway
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    singleton = jvm.java.lang.Class.forName(f"org.apache.iceberg.spark.{name}", True, loader)
    return singleton.getMethod("get", gateway.new_array(jvm.java.lang.Class, 0)).invoke(None, gateway.new_array(jvm.java.lang.Object, 0))


def compact_if_due(
    spark: SparkSession,
    catalog: str,
    target: str,
    file_threshold: int,
    before_rewrite: Callable[[], None] = lambda: None,
    settled: int | None = None,
    deleted_rows_bytes: int | None = None,
) -> CompactionResult | None:
    """Compaction only (no expiry, no orphan listing) once the table's readers open `file_threshold` files more than
    they need, or than the `settled` count its last compaction left (TableTotals.compaction_due), or its deleted rows
    are due for a rewrite and `deleted_rows_bytes` leaves room for one (or they are overdue); None when not due. The
    sync run asks after every merge, for the table and its tombstones, with the bytes it can rewrite in what is left of
    the cycle's interval: a busy table is compacted often, a quiet one not at all, and the deleted rows go a slice at a
    time. `before_rewrite` raises when this writer may no longer commit to `main`."""
    totals = table_totals(spark, target)
    files_due = totals.compaction_due(file_threshold, settled)
    if not (files_due or totals.deleted_share >= (DELETED_SHARE_REWRITE if deleted_rows_bytes != 0 else DELETED_SHARE_OVERDUE)):
        return None
    before_rewrite()
    return compact(spark, catalog, target, deleted_rows_bytes, pack_small_files=files_due, totals=totals)


@dataclass
class MaintenanceResult:
    before: TableFiles
    after: TableFiles
    rewritten_data_files: int
    added_data_files: int
    expired_snapshots: int
    deleted_data_files: int
    # None: this pass did not list the table's files for orphans.
    orphan_files_removed: int | None
    # None: this pass did not look for tombstones past their retention.
    pruned_tombstones: int | None

    @property
    def orphans_swept(self) -> bool:
        return self.orphan_files_removed is not None

    def metadata(self) -> dict:
        """Flat numbers, so the UI can plot them."""
        files = {f"{when}_{name}": value for when, state in (("before", self.before), ("after", self.after)) for name, value in vars(state).items()}
        counts = {name: value for name, value in vars(self).items() if isinstance(value, int)}
        return {**files, **counts, "average_data_file_bytes": self.after.average_data_file_bytes, "orphans_swept": self.orphans_swept}


def maintain_table(
    spark: SparkSession,
    catalog: str,
    target: str,
    snapshot_retention: timedelta,
    retain_last: int,
    orphan_age: timedelta,
    tombstone_retention: timedelta | None = None,
    now: datetime | None = None,
    remove_orphans: bool = True,
    writer: WriterBranch | None = None,
) -> MaintenanceResult:
    """Compaction, then `trim_history`; with `remove_orphans` (the daily sweep) and a `tombstone_retention` (a table with
    tombstones), pruning of tombstones past it first: a tombstone kept up to a sweep interval longer only buries what
    it would have buried anyway. The pruning removes rows: with a `writer`, it commits to that writer's branch and is
    published (writer_branch.py); compaction changes no row and commits to `main` (Iceberg refuses a rewrite whose
    files changed). Refuses retentions below their floors. The whole pass, for a table no sync writes (the orders load,
    maintenance on demand)."""
    check_floors(snapshot_retention, orphan_age, retain_last)
    now = now or datetime.now(UTC)
    catalog = validate_identifier(catalog, "catalog name")
    before = table_files(spark, target)
    compaction = compact(spark, catalog, target)
    pruned = None
    if tombstone_retention is not None:
        tombstones = tombstone_table(target)
        if remove_orphans:
            pruned = prune_tombstones(spark, tombstones, now - tombstone_retention, writer)
        # Deletes append tombstones every few seconds: the tombstone table needs the same upkeep to stay bounded.
        compact(spark, catalog, tombstones)
    trimmed = trim_history(spark, catalog, target, snapshot_retention, retain_last, orphan_age, tombstone_retention is not None, now, remove_orphans)
    return replace(
        trimmed, before=before, rewritten_data_files=compaction.rewritten_data_files, added_data_files=compaction.added_data_files, pruned_tombstones=pruned
    )


def trim_history(
    spark: SparkSession,
    catalog: str,
    target: str,
    snapshot_retention: timedelta,
    retain_last: int,
    orphan_age: timedelta,
    with_tombstones: bool,
    now: datetime | None = None,
    remove_orphans: bool = True,
) -> MaintenanceResult:
    """Expiry past the retention and, unless `remove_orphans` is false (the daily sweep: it reads every manifest),
    orphan removal past its age, of the table and its tombstones if it has them. Neither changes a row nor moves
    `main` (expiry keeps the snapshots refs point at, and `_expire` the newest carrying KEPT_SUMMARY_PROPERTIES), so it
    needs no writer and runs beside one: the writer's fast-forward of `main` and this commit are compare-and-swaps of
    the metadata pointer, and each is tried again on the fresh table when it loses. Refuses retentions below their
    floors."""
    check_floors(snapshot_retention, orphan_age, retain_last)
    now = now or datetime.now(UTC)
    catalog = validate_identifier(catalog, "catalog name")
    before = table_files(spark, target)
    tables = (target, tombstone_table(target)) if with_tombstones else (target,)
    deleted = [_expire(spark, catalog, table, now - snapshot_retention, retain_last) for table in tables]
    orphans = [_remove_orphans(spark, catalog, table, orphan_age) for table in tables] if remove_orphans else None
    after = table_files(spark, target)
    return MaintenanceResult(
        before=before,
        after=after,
        rewritten_data_files=0,
        added_data_files=0,
        expired_snapshots=before.snapshots - after.snapshots,
        deleted_data_files=deleted[0],
        orphan_files_removed=orphans[0] if orphans is not None else None,
        pruned_tombstones=None,
    )


def prune_tombstones(spark: SparkSession, tombstones: str, older_than: datetime, writer: WriterBranch | None) -> int:
    """Deletes the tombstones of deletes made before `older_than` (past the retention no file with an older change of
    their key may remain), on `writer`'s branch and published. While none is that old, which the files' own bounds
    say (a read of the manifests), no row is read and nothing is committed."""
    files, oldest = spark.sql(f"SELECT count(*), min(readable_metrics.deleted_at.lower_bound) FROM {dotted_name(tombstones)}.files").collect()[0]
    # A file without bounds (metrics off) could hold old tombstones: pruned then as if due.
    if not files or (oldest is not None and oldest.replace(tzinfo=UTC) >= older_than):
        return 0
    if writer is not None:
        writer.take(tombstones)
    tombstones_sql = writer.ref(tombstones) if writer is not None else dotted_name(tombstones)
    expired = f"deleted_at < {timestamp_literal(older_than)}"
    pruned = spark.sql(f"SELECT count(*) FROM {tombstones_sql} WHERE {expired}").collect()[0][0]
    if pruned:
        spark.sql(f"DELETE FROM {tombstones_sql} WHERE {expired}")
        if writer is not None:
            writer.publish(tombstones)
    return pruned


def _expire(spark: SparkSession, catalog: str, target: str, older_than: datetime, retain_last: int) -> int:
    """Expires snapshots older than `older_than` beyond the last `retain_last`, but none from the newest that carries
    each of KEPT_SUMMARY_PROPERTIES on: upkeep's own snapshots (compaction's) carry none, and on a quiet table they
    could otherwise be all that is kept. The data and delete files deleted."""
    carriers = newest_carriers_committed_at(spark, target, KEPT_SUMMARY_PROPERTIES)
    older_than = min(older_than, carriers) if carriers is not None else older_than
    expire = spark.sql(
        f"CALL {catalog}.system.expire_snapshots(table => '{dotted_name(target)}', "
        f"older_than => {timestamp_literal(older_than)}, retain_last => {int(retain_last)})"
    ).collect()[0]
    return expire["deleted_data_files_count"] + expire["deleted_position_delete_files_count"]


def _remove_orphans(spark: SparkSession, catalog: str, target: str, orphan_age: timedelta) -> int:
    # Files carry real modification times (and Iceberg refuses anything under 24 hours from the real now).
    older_than = datetime.now(UTC) - orphan_age
    return spark.sql(f"CALL {catalog}.system.remove_orphan_files(table => '{dotted_name(target)}', older_than => {timestamp_literal(older_than)})").count()


@dataclass(frozen=True)
class MaintenanceState:
    """What a table records of its upkeep."""

    # When it was last maintained; a table never maintained counts from its oldest snapshot (a new table needs
    # no upkeep yet); None for a table without snapshots.
    maintained_at: datetime | None
    # When its files were last listed for orphans; None if never.
    orphans_removed_at: datetime | None
    # When its tombstones were last looked at for pruning; None if never.
    tombstones_pruned_at: datetime | None = None

    def orphan_sweep_due(self, interval: timedelta, now: datetime) -> bool:
        return self.orphans_removed_at is None or now - self.orphans_removed_at >= interval

    def tombstone_pruning_due(self, interval: timedelta, now: datetime) -> bool:
        return self.tombstones_pruned_at is None or now - self.tombstones_pruned_at >= interval


def _recorded_time(properties: dict[str, str], name: str) -> datetime | None:
    recorded = properties.get(name)
    return datetime.fromisoformat(recorded) if recorded else None


def maintenance_state(spark: SparkSession, target: str) -> MaintenanceState:
    properties = table_properties(spark, target)
    orphans_removed_at, tombstones_pruned_at = (_recorded_time(properties, name) for name in (ORPHANS_REMOVED_AT_PROPERTY, TOMBSTONES_PRUNED_AT_PROPERTY))
    maintained_at = _recorded_time(properties, MAINTAINED_AT_PROPERTY)
    if maintained_at is None:
        oldest = spark.sql(f"SELECT min(committed_at) FROM {dotted_name(target)}.snapshots").collect()[0][0]
        maintained_at = oldest.replace(tzinfo=UTC) if oldest else None  # the session time zone is UTC
    return MaintenanceState(maintained_at, orphans_removed_at, tombstones_pruned_at)


def maintenance_due(spark: SparkSession, target: str, interval: timedelta, now: datetime | None = None) -> bool:
    since = maintenance_state(spark, target).maintained_at
    return since is not None and (now or datetime.now(UTC)) - since >= interval


def record_maintained(spark: SparkSession, target: str, result: MaintenanceResult, now: datetime | None = None) -> None:
    """Records the pass on the table (one commit): when it ran, when it last listed orphans and looked for tombstones
    to prune, if it did."""
    at = (now or datetime.now(UTC)).isoformat()
    recorded = {
        MAINTAINED_AT_PROPERTY: at,
        **({ORPHANS_REMOVED_AT_PROPERTY: at} if result.orphans_swept else {}),
        **({TOMBSTONES_PRUNED_AT_PROPERTY: at} if result.pruned_tombstones is not None else {}),
    }
    spark.sql(set_properties_sql(target, recorded))


def record_tombstones_pruned(spark: SparkSession, target: str, now: datetime) -> None:
    spark.sql(set_properties_sql(target, {TOMBSTONES_PRUNED_AT_PROPERTY: now.isoformat()}))
