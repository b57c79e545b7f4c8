"""One exported table's partition load, whole: its export files into the table, the full export recorded, and the table's
daily upkeep when it is due (Spark only, no Dagster).

The request and the outcome are plain JSON values: the same function runs in the Dagster run, and as the
Spark job the run submits (`ddb_athena/exported/orders_load_job.py`, locally through spark-submit or on EMR
Serverless), which receives the request through Dagster Pipes and reports the outcome back the same way.
"""

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from pyspark.sql import SparkSession

from ddb_athena.lake.export_load import ExportDataFile, ExportLoadResult, load_export_files, record_loaded_full_export
from ddb_athena.lake.maintenance import maintain_table, maintenance_due, record_maintained
from ddb_athena.lake.writer_branch import WriterBranch, retried_when_main_moved
from ddb_athena.lib.declarations import declared

# An exported table changes once a day: its upkeep (compaction, expiry, orphans) runs with the first load of a day.
EXPORTED_MAINTENANCE_INTERVAL = timedelta(hours=20)
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportUpkeep:
    snapshot_retention_hours: float
    retain_last: int
    orphan_file_age_days: float


@dataclass(frozen=True)
class ExportLoadRequest:
    # The declared table (ddb_athena/tables.toml, shipped with the job): its key, columns and partitioning.
    table: str
    target: str
    catalog: str
    files: list[ExportDataFile]
    quarantine_uri: str
    exported_at: datetime
    upkeep: ExportUpkeep
    now: datetime
    # Set when the files are a full export: the table then holds every order as of `exported_at`.
    full_export_arn: str | None = None
    # The launching run's writer lease (uri, holder, ttl_seconds): a job checks it before it commits.
    writer_lease: dict | None = None
    # That lease's holding: the load commits to the writer branch named after it, published only while no other
    # writer has taken the table (lake/writer_branch.py), and takes the table only while no newer holding has.
    writer_token: str | None = None
    writer_epoch: int = 0

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "files": [[file.uri, file.items] for file in self.files],
            "exported_at": self.exported_at.isoformat(),
            "now": self.now.isoformat(),
        }

    @classmethod
    def from_json(cls, data: dict) -> "ExportLoadRequest":
        return cls(
            table=data["table"],
            target=data["target"],
            catalog=data["catalog"],
            files=[ExportDataFile(uri, items) for uri, items in data["files"]],
            quarantine_uri=data["quarantine_uri"],
            exported_at=datetime.fromisoformat(data["exported_at"]),
            upkeep=ExportUpkeep(**data["upkeep"]),
            now=datetime.fromisoformat(data["now"]),
            full_export_arn=data.get("full_export_arn"),
            writer_lease=data.get("writer_lease"),
            writer_token=data.get("writer_token"),
            writer_epoch=data.get("writer_epoch", 0),
        )


@dataclass
class ExportLoadOutcome:
    """What the load did (JSON values only): the asset's metadata and checks are read from it."""

    load: ExportLoadResult
    maintenance: dict[str, int | float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "ExportLoadOutcome":
        return cls(ExportLoadResult(**data["load"]), data["maintenance"])


def load_export_partition(spark: SparkSession, request: ExportLoadRequest, before_commit: Callable[[], None] = lambda: None) -> ExportLoadOutcome:
    """`before_commit` raises when this writer may no longer commit: checked before the table is taken (a job that
    starts after its run died, the lease taken by a re-execution, stops here) and again right before the MERGE."""
    before_commit()
    writer = WriterBranch(lambda: spark, request.catalog, (request.target,), request.writer_token, request.writer_epoch) if request.writer_token else None
    try:
        return retried_when_main_moved(lambda: _load(spark, request, before_commit, writer), warn=_log.warning)
    finally:
        if writer is not None:
            writer.drop()


def _load(spark: SparkSession, request: ExportLoadRequest, before_commit: Callable[[], None], writer: WriterBranch | None) -> ExportLoadOutcome:
    result = load_export_files(
        spark,
        declared(request.table).spec,
        request.target,
        request.files,
        request.quarantine_uri,
        exported_at=request.exported_at,
        before_commit=before_commit,
        writer=writer,
    )
    if request.full_export_arn:
        # Days that end by the export's time need no export of their own from now on.
        record_loaded_full_export(spark, request.target, request.full_export_arn, request.exported_at)
    maintenance = {}
    if maintenance_due(spark, request.target, EXPORTED_MAINTENANCE_INTERVAL, request.now):
        # Upkeep commits to main itself: only while this writer still holds the table.
        before_commit()
        if writer is not None:
            writer.check_fence()
        upkeep = request.upkeep
        maintained = maintain_table(
            spark,
            request.catalog,
            request.target,
            snapshot_retention=timedelta(hours=upkeep.snapshot_retention_hours),
            retain_last=upkeep.retain_last,
            orphan_age=timedelta(days=upkeep.orphan_file_age_days),
            writer=writer,
        )
        record_maintained(spark, request.target, maintained, request.now)
        maintenance = maintained.metadata()
    return ExportLoadOutcome(result, maintenance)
