"""The job's submission: spark-submit's command line, and the EMR Serverless configuration and request."""

from pathlib import Path

import pytest

from ddb_athena.lake.job_submission import (
    EMR_ICEBERG_RUNTIME,
    EmrServerlessJob,
    JobSubmissionError,
    emr_spark_config,
    spark_home_environment,
    spark_submit_command,
    start_job_run_params,
)
from ddb_athena.lake.session_config import SparkIcebergOptions, iceberg_spark_config

ROLE = "arn:aws:iam::123456789012:role/ddb-athena-SparkJobRole"
JOB = EmrServerlessJob(
    application_id="00fabcdefghij000",
    execution_role_arn=ROLE,
    code_uri="s3://code-bucket/ddb_athena/emr/",
    entry_point="orders_load_job.py",
    archive="ddb_athena_job.zip",
    log_group="/ddb_athena/ddb-athena/spark",
    python="/usr/bin/python3.11",
    timeout_minutes=120,
)
AWS_CONFIG = iceberg_spark_config(SparkIcebergOptions(profile="aws", warehouse="s3://prod/warehouse", master="local[2]"))


def test_spark_submit_is_the_installed_pyspark_s_with_every_setting_as_a_conf_and_the_entry_point_last(tmp_path):
    import pyspark

    command = spark_submit_command({"spark.master": "local[2]", "spark.jars": "/a.jar,/b.jar"}, tmp_path / "job.py")
    assert command[0] == str(Path(pyspark.__file__).parent / "bin" / "spark-submit") and Path(command[0]).is_file()
    assert command[1:] == ["--conf", "spark.jars=/a.jar,/b.jar", "--conf", "spark.master=local[2]", str(tmp_path / "job.py")]
    assert spark_home_environment() == {"SPARK_HOME": str(Path(pyspark.__file__).parent)}


def test_the_emr_configuration_uses_the_platform_iceberg_and_the_image_python():
    config = emr_spark_config(AWS_CONFIG, "/usr/bin/python3.11")
    assert config["spark.jars"] == EMR_ICEBERG_RUNTIME
    assert config["spark.sql.catalog.lake.catalog-impl"] == "org.apache.iceberg.aws.glue.GlueCatalog"
    assert config["spark.sql.catalog.lake.warehouse"] == "s3://prod/warehouse"
    assert config["spark.emr-serverless.driverEnv.PYSPARK_PYTHON"] == config["spark.executorEnv.PYSPARK_PYTHON"] == "/usr/bin/python3.11"
    # What belongs to the machine that built the configuration stays there.
    for name in ("spark.master", "spark.pyspark.python", "spark.jars.packages", "spark.driver.extraJavaOptions", "spark.sql.shuffle.partitions"):
        assert name not in config


def test_a_setting_with_whitespace_is_refused_for_emr():
    with pytest.raises(JobSubmissionError, match="spark.executor.extraJavaOptions"):
        emr_spark_config({**AWS_CONFIG, "spark.executor.extraJavaOptions": "-Xss4m -XX:+UseG1GC"}, "/usr/bin/python3.11")


def test_the_start_request_carries_code_configuration_logging_and_an_idempotency_token():
    params = start_job_run_params(JOB, {"spark.b": "2", "spark.a": "1"}, name="ddb_athena orders_athena 2026-11-22", client_token="run-1")
    assert params["applicationId"] == "00fabcdefghij000" and params["executionRoleArn"] == ROLE
    assert params["clientToken"] == "run-1" and params["executionTimeoutMinutes"] == 120
    driver = params["jobDriver"]["sparkSubmit"]
    assert driver["entryPoint"] == "s3://code-bucket/ddb_athena/emr/orders_load_job.py"
    assert driver["sparkSubmitParameters"] == "--py-files s3://code-bucket/ddb_athena/emr/ddb_athena_job.zip --conf spark.a=1 --conf spark.b=2"
    logging = params["configurationOverrides"]["monitoringConfiguration"]["cloudWatchLoggingConfiguration"]
    assert logging == {"enabled": True, "logGroupName": "/ddb_athena/ddb-athena/spark", "logTypes": {"SPARK_DRIVER": ["STDOUT", "STDERR"]}}


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("application_id", "", "application id"),
        ("application_id", "app id; rm", "application id"),
        ("execution_role_arn", "", "execution role ARN"),
        ("execution_role_arn", "arn:aws:iam::123:user/someone", "execution role ARN"),
        ("code_uri", "", "code location"),
        ("code_uri", "/local/path", "code location"),
        ("log_group", "", "log group"),
        ("timeout_minutes", 0, "timeout"),
    ],
)
def test_a_missing_or_malformed_emr_setting_is_named(field, value, named):
    from dataclasses import replace

    with pytest.raises(JobSubmissionError, match=named):
        replace(JOB, **{field: value})
