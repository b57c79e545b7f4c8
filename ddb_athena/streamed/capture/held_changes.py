"""The in-process capture's change files on local disk, and its positions committed with the data.

With Spark in the run's own process, a cycle's change files need not be durable: until the commit that applies them,
the stream still holds their records (24 hours), and the positions that say so move only with that commit
(CommittedCheckpoints). So they are written to a local directory that Spark reads, and deleted once committed, or
once the cycle failed (the next capture reads the same records again).
"""

import tempfile
from pathlib import Path

from ddb_athena.streamed.capture.change_files import ChangeRecord, change_file_body
from ddb_athena.streamed.capture.checkpoints import CommittedCheckpoints, ShardCheckpoint


class HeldChanges:
    def __init__(self, positions: CommittedCheckpoints):
        self.positions = positions
        # Removed with its files by `close()` when the run lets go of the table: its holder is in a reference cycle
        # (the positions call back into the sync), which the collector may not free before the run worker exits.
        self._scratch = tempfile.TemporaryDirectory(prefix="ddb_athena_changes_", ignore_cleanup_errors=True)
        self._directory = Path(self._scratch.name)
        # Change files written since the last commit, as URIs Spark reads.
        self.files: list[str] = []
        self._legacy_checkpoints_removed = False

    def write(self, name: str, records: list[ChangeRecord]) -> str:
        path = self._directory / name
        path.write_bytes(change_file_body(records))
        self.files.append(path.as_uri())
        return self.files[-1]

    def to_commit(self) -> str | None:
        """The positions to commit with this cycle's merge: None when it holds no file and no position moved."""
        return self.positions.positions_json() if self.files or self.positions.changed else None

    def committed(self) -> None:
        """The merge carrying `to_commit()` was published: the files are done with, and the checkpoints in S3 (a
        bootstrap's, or an earlier version's: the positions' starting point) are superseded."""
        self.positions.commit()
        self._clear()
        if not self._legacy_checkpoints_removed:
            self.positions.fallback.delete_all()
            self._legacy_checkpoints_removed = True

    def restart_durably(self, positions: list[ShardCheckpoint]) -> None:
        """A bootstrap's positions (the stream's end before its scan), also saved in S3 until its merge commits them."""
        self.positions.fallback.delete_all()
        for checkpoint in positions:
            self.positions.fallback.save(checkpoint)
        self._legacy_checkpoints_removed = False

    def rollback(self) -> None:
        self.positions.rollback()
        self._clear()

    def close(self) -> None:
        """The run let go of the table: files not committed are dropped (their positions were not committed either, so
        the next writer reads those changes again from the stream)."""
        self.files = []
        self._scratch.cleanup()

    def _clear(self) -> None:
        for uri in self.files:
            Path(uri.removeprefix("file://")).unlink(missing_ok=True)
        self.files = []
