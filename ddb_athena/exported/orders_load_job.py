"""The orders load as a Spark job: `spark-submit orders_load_job.py`, on EMR Serverless or locally.

Dagster Pipes brings the request (the extra `orders_load`, see `ExportLoadRequest`) and takes the outcome back as
the materialization's metadata (`orders_load`). The SparkSession is the one spark-submit configured.
"""

import json

from dagster_pipes import open_dagster_pipes
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from ddb_athena.exported.partition_load import ExportLoadRequest, load_export_partition
from ddb_athena.lib.lease_record import not_held_by

REQUEST_EXTRA = "orders_load"
# The `--py-files` archive of the modules this job imports, beside it in the code location (`make emr-job`).
JOB_ARCHIVE_NAME = "ddb_athena_job.zip"
OUTCOME_METADATA = "orders_load"


def main() -> None:
    with open_dagster_pipes() as pipes:
        request = ExportLoadRequest.from_json(pipes.get_extra(REQUEST_EXTRA))
        pipes.log.info(f"Loading {len(request.files)} export files into {request.target}")
        spark = SparkSession.builder.getOrCreate()
        outcome = load_export_partition(spark, request, before_commit=lambda: still_the_writer(spark, request))
        pipes.log.info(f"Inserted {outcome.load.rows_inserted} rows; snapshot {outcome.load.snapshot_id}")
        pipes.report_asset_materialization(metadata={OUTCOME_METADATA: {"raw_value": outcome.to_json(), "type": "json"}})


class WriterLeaseLost(RuntimeError):
    """The run that launched this job no longer holds the table's writer lease."""


def still_the_writer(spark: SparkSession, request: ExportLoadRequest) -> None:
    """The run that launched this job holds the table's lease while it waits (and renews it): a job whose run died,
    and whose table another writer took, stops before its MERGE. Read through the job's own file system, by no clock;
    a takeover after this check is refused by the fence (lake/writer_branch.py)."""
    lease = request.writer_lease
    if not lease:
        return
    body = _lease_body(spark, lease["uri"])
    reason = not_held_by(body, lease["holder"], request.writer_token)
    if reason:
        raise WriterLeaseLost(f"{request.target}: {reason}; this job stops without committing")


# The holder renews the lease while the job reads it: a renewal between S3A's open and its read fails the read.
LEASE_READ_ATTEMPTS = 3


def _lease_body(spark: SparkSession, uri: str) -> dict | None:
    """The lease object's content; None without one (released, or never taken)."""
    for _ in range(LEASE_READ_ATTEMPTS - 1):
        try:
            return _read_lease(spark, uri)
        except Exception as error:  # noqa: BLE001 - py4j's error names S3A's exception in its text only
            if "RemoteFileChangedException" not in str(error):
                raise
    return _read_lease(spark, uri)


def _read_lease(spark: SparkSession, uri: str) -> dict | None:
    try:
        return json.loads("".join(row.value for row in spark.read.text(uri).collect()))
    except AnalysisException:
        return None


if __name__ == "__main__":
    main()
