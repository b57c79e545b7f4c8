"""How a Spark job is submitted (no Dagster): spark-submit's command line here, an EMR Serverless StartJobRun
request on AWS. Both carry the same Iceberg configuration (`session_config`) as `--conf` settings."""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# What EMR Serverless provides: its Iceberg runtime (with the AWS bundle) and the Glue Data Catalog client
# (docs.aws.amazon.com/emr/latest/EMR-Serverless-UserGuide/using-iceberg.html).
EMR_ICEBERG_RUNTIME = "/usr/share/aws/iceberg/lib/iceberg-spark3-runtime.jar"
EMR_GLUE_METASTORE_FACTORY = "com.amazonaws.glue.catalog.metastore.AWSGlueDataCatalogHiveClientFactory"
# Settings that belong to the process that builds the configuration, not to a job elsewhere (the shuffle
# partitions are sized for a 2-core machine; on a cluster Spark's default and AQE's coalescing apply).
_SUBMITTER_ONLY = ("spark.master", "spark.pyspark.python", "spark.driver.extraJavaOptions", "spark.jars.packages", "spark.sql.shuffle.partitions")
_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+$")
_APPLICATION_ID = re.compile(r"^[0-9a-z]+$")


class JobSubmissionError(ValueError):
    """The job cannot be submitted as configured."""


def conf_arguments(config: Mapping[str, str]) -> list[str]:
    return [argument for name, value in sorted(config.items()) for argument in ("--conf", f"{name}={value}")]


def spark_submit_command(config: Mapping[str, str], entry_point: Path) -> list[str]:
    """The installed PySpark's spark-submit of `entry_point`, with `config` (master, JARs and all) as `--conf`
    settings; run it with `spark_home_environment()`."""
    return [str(_spark_home() / "bin" / "spark-submit"), *conf_arguments(config), str(entry_point)]


def spark_home_environment() -> dict[str, str]:
    # Without SPARK_HOME, spark-submit asks whatever `python3` is on the PATH where PySpark is.
    return {"SPARK_HOME": str(_spark_home())}


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


@dataclass(frozen=True)
class EmrServerlessJob:
    """Where and as whom the job runs on EMR Serverless."""

    application_id: str
    execution_role_arn: str
    # s3://bucket/prefix holding the entry point and the package archive (`make emr-job`).
    code_uri: str
    entry_point: str
    archive: str
    log_group: str
    python: str
    timeout_minutes: int

    def __post_init__(self):
        problems = []
        if not _APPLICATION_ID.match(self.application_id or ""):
            problems.append(f"application id {self.application_id!r} (the stack's SparkApplicationId output)")
        if not _ROLE_ARN.match(self.execution_role_arn or ""):
            problems.append(f"execution role ARN {self.execution_role_arn!r} (the stack's SparkJobRoleArn output)")
        if not (self.code_uri or "").startswith("s3://") or len(self.code_uri) <= len("s3://"):
            problems.append(f"code location {self.code_uri!r} (an s3:// prefix holding what `make emr-job` built)")
        if not self.log_group:
            problems.append("log group (the stack's SparkLogGroupName output; Pipes reads the job's messages from it)")
        if not self.timeout_minutes or self.timeout_minutes < 1:
            problems.append(f"timeout {self.timeout_minutes!r} (whole minutes)")
        if problems:
            raise JobSubmissionError("EMR Serverless job settings missing or malformed: " + "; ".join(problems))

    def code(self, name: str) -> str:
        return f"{self.code_uri.rstrip('/')}/{name}"


def emr_spark_config(iceberg_config: Mapping[str, str], python: str) -> dict[str, str]:
    """The Iceberg configuration for a job on EMR Serverless: the platform's Iceberg runtime and Glue client, the
    image's Python for the driver and the executors, and nothing that only makes sense where it was built."""
    config = {name: value for name, value in iceberg_config.items() if name not in _SUBMITTER_ONLY}
    config.update(
        {
            "spark.jars": EMR_ICEBERG_RUNTIME,
            "spark.hadoop.hive.metastore.client.factory.class": EMR_GLUE_METASTORE_FACTORY,
            "spark.emr-serverless.driverEnv.PYSPARK_DRIVER_PYTHON": python,
            "spark.emr-serverless.driverEnv.PYSPARK_PYTHON": python,
            "spark.executorEnv.PYSPARK_PYTHON": python,
        }
    )
    # sparkSubmitParameters is one string split at whitespace.
    spaced = sorted(name for name, value in config.items() if re.search(r"\s", value))
    if spaced:
        raise JobSubmissionError(f"Spark settings with whitespace cannot go into sparkSubmitParameters: {', '.join(spaced)}")
    return config


def start_job_run_params(job: EmrServerlessJob, spark_config: Mapping[str, str], name: str, client_token: str) -> dict:
    """StartJobRun's request: the entry point and archive from S3, the configuration, CloudWatch logging on (the
    Pipes messages travel in the driver's stdout), a timeout, and an idempotency token (a retried request of the
    same run starts no second job)."""
    return {
        "applicationId": job.application_id,
        "executionRoleArn": job.execution_role_arn,
        "name": name,
        "clientToken": client_token,
        "executionTimeoutMinutes": job.timeout_minutes,
        "jobDriver": {
            "sparkSubmit": {
                "entryPoint": job.code(job.entry_point),
                "sparkSubmitParameters": " ".join(["--py-files", job.code(job.archive), *conf_arguments(spark_config)]),
            }
        },
        "configurationOverrides": {
            "monitoringConfiguration": {
                "cloudWatchLoggingConfiguration": {
                    "enabled": True,
                    "logGroupName": job.log_group,
                    "logTypes": {"SPARK_DRIVER": ["STDOUT", "STDERR"]},
                }
            }
        },
    }
