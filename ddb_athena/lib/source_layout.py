"""Where a source's files live in S3: a books stream's change files and their bookkeeping, an orders export's files."""

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLayout:
    """The S3 prefixes of one source: change files, checkpoints, commit manifests, quarantine."""

    bucket: str
    prefix: str

    @property
    def changes_prefix(self) -> str:
        return f"{self.prefix}/changes/"

    @property
    def checkpoints_prefix(self) -> str:
        return f"{self.prefix}/_checkpoints/"

    @property
    def manifests_prefix(self) -> str:
        return f"{self.prefix}/_manifests/"

    @property
    def snapshots_prefix(self) -> str:
        """A bootstrap's snapshot parts, read only once the snapshot is sealed (capture/bootstrap.py)."""
        return f"{self.prefix}/_snapshots/"

    @property
    def failures_prefix(self) -> str:
        """Batches the capture Lambda gave up on, moved here from its queue (capture/failed_batches.py)."""
        return f"{self.prefix}/_capture_failures/"

    @property
    def quarantine_prefix(self) -> str:
        return f"{self.prefix}/quarantine/"

    def uri(self, key: str, scheme: str = "s3") -> str:
        return f"{scheme}://{self.bucket}/{key}"
