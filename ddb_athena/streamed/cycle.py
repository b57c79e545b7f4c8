"""One cycle of the books sync: capture the stream into change files, then MERGE them into Iceberg. No Dagster: the
same object runs in a Dagster run or anywhere else a SparkSession can be had.

The run's own capture, with Spark in this process, keeps its change files on local disk and its stream positions in
the Iceberg commit that applies them (`hold_changes`): no S3 request for either, and a crash anywhere before the
commit reads the same records again from the stream (exactly once: the positions move with the data). Files in S3
(the capture Lambda's, a bootstrap's snapshot) are merged as they come and recorded in a commit manifest for their
cleanup.

Capture is the run's own (it reads the stream) or, deployed on AWS, the capture Lambda's (it writes the change
files; the run only merges them and, to bootstrap, scans the table). A cycle that captured nothing and finds no
change file is idle: it touches no Spark (the session is not
even created until a cycle needs it) and commits no snapshot.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from ddb_athena.lake.change_merge import BOOTSTRAP_FILE_PROPERTY, STREAM_POSITIONS_PROPERTY, merge_change_files, table_exists, table_properties
from ddb_athena.lake.commit_properties import newest_published
from ddb_athena.lake.table_spec import TableSpec
from ddb_athena.lake.writer_branch import WriterBranch
from ddb_athena.lib.source_layout import SourceLayout
from ddb_athena.streamed.capture.bootstrap import (
    bootstrap_snapshot,
    delete_unsealed_parts,
    newer_than_applied,
    pending_snapshot,
    snapshot_position,
    with_snapshot_parts,
)
from ddb_athena.streamed.capture.change_files import SNAPSHOT_KIND, ChangeFileNamer, change_file_keys, list_keys, parse_change_file_name
from ddb_athena.streamed.capture.checkpoints import CheckpointStore, CommittedCheckpoints, MemoryCheckpoints, ShardCheckpoint
from ddb_athena.streamed.capture.commit_manifests import committed_files, write_commit_manifest
from ddb_athena.streamed.capture.failed_batches import forget_covered
from ddb_athena.streamed.capture.held_changes import HeldChanges
from ddb_athena.streamed.capture.quarantine import quarantine_foreign_files
from ddb_athena.streamed.capture.stream_reader import StreamCapture


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


@dataclass
class CycleOutcome:
    """Metadata of books_source and books_iceberg for one cycle."""

    source: dict
    merged: dict
    idle: bool


class StreamSync:
    """The state a sync run keeps across its cycles for one streamed table: clients, the change-file namer, the SparkSession."""

    def __init__(
        self,
        dynamodb,
        streams,
        s3,
        spark: Callable[[], SparkSession],
        source_scheme: str,
        table_name: str,
        iceberg_table: str,
        layout: SourceLayout,
        log: Callable[[str], None],
        warn: Callable[[str], None],
        *,
        spec: TableSpec,
        capture_stream: bool = True,
        before_write: Callable[[], None] = lambda: None,
        capture_seconds: float | None = None,
        writer: WriterBranch | None = None,
        hold_changes: bool = False,
    ):
        """`before_write` is called before each step that writes (checkpoints, change files, the table, the manifest):
        it raises when this writer may no longer write (its lease was lost). `writer` is this writer's branch of the
        table and its tombstones: a commit that outlived the lease is never published (lake/writer_branch.py). A capture
        reads the stream for at most `capture_seconds` (the cycle's interval): behind, the table still moves every cycle.
        `hold_changes` (the run's own capture, Spark in this process): change files on local disk, positions committed
        with the data. `spec` is the table's shape (its key, its typed columns)."""
        self._dynamodb, self._s3, self._spark, self._spec = dynamodb, s3, spark, spec
        self._before_write, self._writer = before_write, writer
        self._scheme, self._table_name, self._iceberg_table, self._layout = source_scheme, table_name, iceberg_table, layout
        self._log, self._warn, self._capture_stream = log, warn, capture_stream
        self._namer = ChangeFileNamer()
        self._held: HeldChanges | None = None
        store = {}
        if hold_changes and capture_stream:
            self._held = HeldChanges(CommittedCheckpoints(self._published_positions, CheckpointStore(s3, layout)))
            store = {"checkpoints": self._held.positions, "write_changes": self._held.write}
        self._streams = streams
        self._capture = self._stream_capture(max_seconds=capture_seconds, **store)
        # Beside the capture Lambda, while a sealed snapshot waits to be merged: this run's own read of the stream
        # through the scan's end (the Lambda delivers those changes only when it gets to them).
        self._window: StreamCapture | None = None
        # Files in S3 are listed by each cycle, but with changes held only by a run's first and a bootstrap's: none
        # other arrives (a file that does waits for the next run; the backlog check sees it meanwhile).
        self._list_staged = True
        self._bootstrap_checked = False
        # A sealed snapshot waits to be merged (sealed by this run, or left by one that failed after its seal): until
        # its merge publishes, every capture reads through the stream's end, as the bootstrap's own cycle does.
        self._snapshot_unmerged = False
        # The tables are created (or brought up to the spec) by the run's first merge; later ones skip that.
        self._tables_ensured = False

    def cycle(self, batch: str, bootstrap: bool = False) -> CycleOutcome:
        """Captures, then merges what is present; `batch` names this cycle's manifest and quarantine."""
        try:
            source = self.capture(bootstrap)
            merged = self.merge(batch)
        except BaseException:
            if self._held is not None:
                self._held.rollback()  # read again from the stream by the next capture
                self._list_staged = True  # and the files in S3 it listed, by the next merge
            raise
        return CycleOutcome(source, merged or self._idle_metadata(), idle=merged is None)

    def close(self) -> None:
        """This writer lets go of the table: its held change files go (see HeldChanges.close)."""
        if self._held is not None:
            self._held.close()

    def _published_positions(self) -> str | None:
        """The positions the table's commits carry; None (start from the checkpoints in S3) while a bootstrap's sealed
        snapshot waits to be merged: its positions, the stream's end before its scan, were saved there."""
        spark = self._spark()
        if not table_exists(spark, self._iceberg_table):
            return None
        # Known once the run's first capture has looked (and kept since); a listing before that.
        if self._snapshot_unmerged if self._bootstrap_checked else self._unmerged_snapshot():
            return None
        return newest_published(spark, self._iceberg_table, STREAM_POSITIONS_PROPERTY)

    def _unmerged_snapshot(self) -> str | None:
        """The newest sealed snapshot that the table has not applied, if any."""
        sealed = pending_snapshot(self._s3, self._layout)
        spark = self._spark()
        applied = table_properties(spark, self._iceberg_table).get(BOOTSTRAP_FILE_PROPERTY) if table_exists(spark, self._iceberg_table) else None
        return sealed if sealed and newer_than_applied(sealed, applied) else None

    def _stream_capture(self, **options) -> StreamCapture:
        return StreamCapture(
            self._dynamodb, self._streams, self._s3, self._table_name, self._layout, namer=self._namer, log=self._log, on_page=self._before_write, **options
        )

    def _window_capture(self, positions: list[ShardCheckpoint]) -> StreamCapture:
        return self._stream_capture(checkpoints=MemoryCheckpoints(positions))

    def capture(self, bootstrap: bool) -> dict:
        self._before_write()
        started = time.monotonic()
        metadata: dict = {"bootstrap_items": 0}
        if bootstrap or not self._bootstrap_checked:
            # Once per run: after the first merge the table exists (a later run checks again).
            missing = not table_exists(self._spark(), self._iceberg_table)
            self._bootstrap_checked = True
            self._snapshot_unmerged = self._unmerged_snapshot() is not None
            if self._snapshot_unmerged and not self._capture_stream:
                self._window = self._window_capture([])  # sealed by a run that failed: from the stream's oldest record
            if bootstrap or (missing and not self._snapshot_unmerged):
                reason = "requested" if bootstrap else f"{self._iceberg_table} does not exist yet"
                self._log(f"Bootstrap ({reason}): scanning {self._table_name}; stream changes made after its start apply on top")
                delete_unsealed_parts(self._s3, self._layout)
                # Where the stream ends before the scan starts: every record up to there is older than the scan, which
                # has seen its effect; applied after the snapshot, it would move its key back.
                # With the capture Lambda too: the snapshot's rows rank at that end, above every older change in whatever
                # file it comes (a late one, a replayed batch, one named by a host whose clock is behind).
                positions = self._capture.present_end()
                snapshot = bootstrap_snapshot(
                    self._dynamodb,
                    self._s3,
                    self._table_name,
                    tuple(column.attribute for column in self._spec.key_columns),
                    self._layout,
                    self._namer,
                    stream_position=StreamCapture.newest(positions),
                    on_progress=self._before_write,
                )
                self._log(f"Snapshot of {snapshot.items} items sealed in {len(snapshot.parts)} parts: {snapshot.change_file}")
                if self._capture_stream:
                    # Only now that the snapshot is durable: the capture resumes where the stream ended before the scan.
                    # A bootstrap that failed before this left the old positions, and with them the gap that the next
                    # capture reports. A scan longer than the stream's 24 hours finds those positions trimmed: a gap too.
                    self._capture.restart_from(positions)
                    if self._held is not None:
                        # Durable until the snapshot's merge commits them: a merge that fails resumes from there.
                        self._held.restart_durably(positions)
                else:
                    self._window = self._window_capture(positions)
                metadata.update(bootstrap_items=snapshot.items, bootstrap_file=snapshot.change_file, bootstrap_parts=len(snapshot.parts))
                self._list_staged = True
                self._snapshot_unmerged = True
        # A snapshot's merge reads through the scan's end before it publishes (in the bootstrap's cycle or, after a
        # failure, a later one): a key the scan saw changed, whose change is among those applied on top, must also get
        # every later change the scan saw, or it would go back.
        if not self._capture_stream:
            # The capture Lambda (reading the stream from its start) names its files after the snapshot's; while the
            # snapshot waits, this run reads the stream through its end itself (the Lambda's copies merge idempotently).
            metadata.update(capture="lambda", source=self._layout.uri(self._layout.changes_prefix))
            if self._window is not None:
                window = self._window.capture(bounded=False)
                metadata.update(records_captured=window.records, change_files_written=len(window.change_files))
            metadata.update(duration_seconds=time.monotonic() - started)
            return metadata
        result = self._capture.capture(bounded=not self._snapshot_unmerged)
        newest = datetime.fromisoformat(result.newest_change_at.replace("Z", "+00:00")) if result.newest_change_at else None
        metadata.update(
            capture="stream",
            records_captured=result.records,
            inserts=result.events.get("INSERT", 0),
            modifies=result.events.get("MODIFY", 0),
            removes=result.events.get("REMOVE", 0),
            change_files_written=len(result.change_files),
            shards_read=result.shards_read,
            stream_arn=result.stream_arn,
            capture_lag_seconds=(datetime.now(UTC) - newest).total_seconds() if newest else 0.0,
            stream_caught_up=result.caught_up,
            duration_seconds=time.monotonic() - started,
            source=self._layout.uri(self._layout.changes_prefix),
        )
        return metadata

    def merge(self, batch: str) -> dict | None:
        """Merges exactly the change files present now; None (and no Spark at all) when there is nothing to do."""
        self._before_write()
        started = time.monotonic()
        staged, foreign = self._staged_files(batch) if self._list_staged else ([], [])
        if self._held is not None:
            self._list_staged = False
        held = list(self._held.files) if self._held else []
        positions = self._held.to_commit() if self._held else None
        if not staged and not held and not positions:
            return {**self._idle_metadata(), "idle": False, "foreign_files_quarantined": len(foreign)} if foreign else None
        files = [self._layout.uri(key, self._scheme) for key in staged] + held
        seals = [key for key in staged if parse_change_file_name(key)[1] == SNAPSHOT_KIND]
        position = snapshot_position(self._s3, self._layout, max(seals)) if seals else None
        self._log(f"Merging {len(files)} change files into {self._iceberg_table}")
        self._before_write()
        result = merge_change_files(
            self._spark(),
            self._spec,
            self._iceberg_table,
            files,
            self._layout.uri(f"{self._layout.quarantine_prefix}{batch}", self._scheme),
            ensure=not self._tables_ensured,
            writer=self._writer,
            snapshot_position=position,
            commit_properties={STREAM_POSITIONS_PROPERTY: positions} if positions else None,
        )
        self._tables_ensured = True
        if seals:  # applied now, or found applied already (its manifest lost)
            self._snapshot_unmerged, self._window = False, None
            if position:
                # Batches the capture Lambda gave up on before the scan: the published snapshot holds their changes.
                forget_covered(self._s3, self._layout, position)
        if self._held is not None:
            self._held.committed()
        manifest = None
        if staged:
            # A snapshot's manifest also lists its parts, which lie beside the change prefix: whether this merge applied
            # it or found it applied already (its manifest lost after the publication).
            files_prefix = f"{self._layout.prefix}/" if seals else None
            manifest = write_commit_manifest(self._s3, self._layout, batch, staged, self._iceberg_table, result.snapshot_id, files_prefix=files_prefix)
        if result.columns_added:
            self._log(f"Columns added to {self._iceberg_table} and filled from each row's item: {', '.join(result.columns_added)}")
        if result.type_mismatches:
            self._warn(f"Merged, with a typed column NULL where the attribute has another type (noted in the quarantine): {result.type_mismatches}")
        if result.records_quarantined:
            self._warn(
                f"Quarantined {result.records_quarantined} records: {result.quarantine_reasons}; {result.keys_held} keys dropped from the "
                "table until their newest change, among them, is fixed and written again"
            )
        now = datetime.now(UTC)
        return {
            "rows_written": result.rows_written,
            "rows_removed": result.rows_removed,
            "keys_changed": result.changes,
            "changes_stale_skipped": result.stale_skipped,
            "files_consumed": len(files),
            "records_consumed": result.records_read,
            "records_quarantined": result.records_quarantined,
            "records_type_mismatched": sum(result.type_mismatches.values()),
            "keys_held": result.keys_held,
            "foreign_files_quarantined": len(foreign),
            "records_superseded_by_bootstrap": result.records_superseded,
            "snapshot_id": result.snapshot_id,
            "lag_seconds": (now - result.newest_change_at).total_seconds() if result.newest_change_at else 0.0,
            "newest_change_at": _iso(result.newest_change_at),
            "duration_seconds": time.monotonic() - started,
            "bootstrap_file": result.bootstrap_file,
            "commit_manifest": manifest,
        }

    def _staged_files(self, batch: str) -> tuple[list[str], list]:
        """The change files in S3 to merge (not yet committed), and the files quarantined as not change files."""
        # The manifests before the listing: a cleanup that runs in between deletes a manifest's files before its
        # manifest, so a file listed is either still there or known as committed (listed first, a file the cleanup
        # deleted would be read by the merge and fail the cycle).
        committed = committed_files(self._s3, self._layout)
        # One listing of the change prefix for both: what is not a change file, and the change files to merge.
        present = list(list_keys(self._s3, self._layout.bucket, self._layout.changes_prefix))
        # A file the merge cannot take would otherwise sit in the prefix forever, its changes lost in silence.
        foreign = quarantine_foreign_files(self._s3, self._layout, batch, present)
        if foreign:
            self._warn(f"Quarantined {len(foreign)} files that are not change files: {', '.join(r.source_file for r in foreign)}")
        # Exactly the files present now: later arrivals wait for the next cycle, none is skipped. Files an earlier
        # cycle committed wait only for their cleanup: merging them again would change nothing and cost a Spark job.
        staged = with_snapshot_parts(self._s3, self._layout, [key for key in change_file_keys(present) if key not in committed])
        return staged, foreign

    @staticmethod
    def _idle_metadata() -> dict:
        """An idle cycle's books_iceberg metadata: the same numbers as a merge's (so the plots stay continuous), all zero."""
        zero = (
            "rows_written",
            "rows_removed",
            "keys_changed",
            "files_consumed",
            "records_consumed",
            "records_quarantined",
            "foreign_files_quarantined",
            "lag_seconds",
        )
        return {**{name: 0 for name in zero}, "idle": True, "commit_manifest": None}
