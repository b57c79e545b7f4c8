"""orders_athena's load as a Spark job through Dagster Pipes: a spark-submit job on this machine, and EMR
Serverless with a stubbed EMR Serverless client. Both must give what the in-process load gives: the same rows
in the table, the same metadata, the same checks."""

import os
import re
import subprocess
import time
from types import SimpleNamespace

import boto3
import pytest
from botocore.stub import Stubber
from dagster import DagsterExecutionInterruptedError, DagsterInstance, materialize

from ddb_athena.exported.load_runner import ENTRY_POINT, ExportLoadRunner
from ddb_athena.lake.job_submission import JobSubmissionError, spark_home_environment, spark_submit_command
from ddb_athena.lib.resources import AwsClientsResource, IcebergSparkResource
from ddb_athena.lib.settings import Settings
from ddb_athena.resources import resources_from_settings
from ddb_athena_build.packaging import build_emr_job
from ddb_athena_tests.books_and_orders import orders_athena, orders_export
from ddb_athena_tests.dagster_helpers import check_results, materialization_metadata
from ddb_athena_tests.deploy.policies import EMR_APPLICATION_ID, EMR_LOG_GROUP, EMR_ROLE_ARN
from ddb_athena_tests.exported.test_assets import put_orders, sync_orders

CODE_BUCKET, CODE_PREFIX = "code-bucket", "ddb_athena/emr"
JOB_RUN_ID = "00fjobrun0000001"
# Differ between any two loads: when, how fast, which commit, which run's manifest, where the load ran.
PER_RUN = {
    "duration_seconds",
    "items_per_second",
    "snapshot_id",
    "commit_manifest",
    "load_ran",
    "AWS EMR Serverless Application ID",
    "AWS EMR Serverless Job Run ID",
}


# The day first, before the emulator's state: see the fixture.
pytestmark = pytest.mark.usefixtures("days")


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as instance:
        yield instance


@pytest.fixture
def loaded_in_process(spark, settings, instance, days):
    """A bootstrap of yesterday's partition, loaded in the run process: the reference."""
    put_orders(settings, 12, seed=7)
    result = sync_orders(instance, days.yesterday)
    return result, f"{settings.namespace}.orders"


def load_again_into(namespace: str, partition: str, instance, monkeypatch, resources: dict | None = None, raise_on_error: bool = True):
    """orders_athena alone, for the partition exported already, into another namespace's table."""
    monkeypatch.setenv("DDB_ATHENA_NAMESPACE", namespace)
    return materialize(
        [orders_export, orders_athena],
        selection=[orders_athena],
        partition_key=partition,
        resources={**resources_from_settings(Settings.from_env()), **(resources or {})},
        instance=instance,
        raise_on_error=raise_on_error,
    )


def rows(spark, table: str) -> list[dict]:
    return [row.asDict() for row in spark.table(table).drop("_synced_at").orderBy("order_id").collect()]


def assert_same_load(spark, reference, reference_table: str, result, table: str) -> None:
    expected, got = materialization_metadata(reference, "orders_athena"), materialization_metadata(result, "orders_athena")
    assert {k: v for k, v in got.items() if k not in PER_RUN} == {k: v for k, v in expected.items() if k not in PER_RUN}
    assert got["snapshot_id"] and got["rows_inserted"] == 12
    expected_checks, got_checks = check_results(reference), check_results(result)
    for name in ("orders_export_reconciles", "orders_no_mutated_documents", "orders_quarantine_empty"):
        assert got_checks[name].passed and got_checks[name].metadata == expected_checks[name].metadata, name
    assert rows(spark, table) == rows(spark, reference_table)


def test_a_partition_loaded_by_a_spark_submit_job_is_the_in_process_load(days, spark, settings, instance, loaded_in_process, monkeypatch):
    reference, reference_table = loaded_in_process
    monkeypatch.setenv("DDB_ATHENA_ORDERS_LOAD", "spark_submit")
    result = load_again_into(f"{settings.namespace}_job", days.yesterday, instance, monkeypatch)
    assert materialization_metadata(result, "orders_athena")["load_ran"] == "spark_submit"
    assert_same_load(spark, reference, reference_table, result, f"{settings.namespace}_job.orders")
    # The job ran in its own JVM, and the run's log shows what it said through Pipes.
    logs = "\n".join(event.message for event in instance.all_logs(result.run_id))
    assert "Loading 1 export files into" in logs and "Inserted 12 rows" in logs


def failure_of(stderr: str) -> str:
    """What a failed job said: each exception's own line (a trace's cause is far from its end), then its last lines."""
    raised = [line for line in stderr.splitlines() if ("Exception" in line or "Error" in line) and not line.lstrip().startswith("at ")]
    return "\n".join(raised[:40]) + "\n...\n" + stderr[-1500:]


class EmrServerless:
    """A stubbed EMR Serverless client (botocore's Stubber). Its job run is a local spark-submit of the same entry
    point with the driver environment the request carries (what EMR Serverless gives the driver), whose stdout goes
    to the CloudWatch log stream where EMR Serverless puts the driver's (the emulator's CloudWatch Logs)."""

    def __init__(self, settings: Settings, local_spark: IcebergSparkResource, release: str = "emr-7.12.0"):
        self.client = boto3.client("emr-serverless", region_name=settings.region, endpoint_url=settings.endpoint_url)
        self.stubber = Stubber(self.client)
        self.settings, self.local_spark, self.release = settings, local_spark, release
        self.started: dict | None = None
        self.job_ran = False

    def expect_the_release_check(self) -> None:
        self.stubber.add_response("get_application", self.application(), {"applicationId": EMR_APPLICATION_ID})

    def expect_a_job(self, then_interrupt: bool = False) -> None:
        """StartJobRun, then the job run's life as GetJobRun reports it (built from the request, when it comes)."""
        self.expect_the_release_check()
        self.client.meta.events.register("provide-client-params.emr-serverless.StartJobRun", lambda params, **_: self._started(params, then_interrupt))
        self.stubber.add_response("start_job_run", {"applicationId": EMR_APPLICATION_ID, "jobRunId": JOB_RUN_ID, "arn": self.job_run_arn})

    @property
    def job_run_arn(self) -> str:
        return f"arn:aws:emr-serverless:us-east-1:123456789012:/applications/{EMR_APPLICATION_ID}/jobruns/{JOB_RUN_ID}"

    def application(self, monitoring: dict | None = None) -> dict:
        application = {
            "applicationId": EMR_APPLICATION_ID,
            "name": "ddb-athena-spark",
            "arn": f"arn:aws:emr-serverless:us-east-1:123456789012:/applications/{EMR_APPLICATION_ID}",
            "releaseLabel": self.release,
            "type": "Spark",
            "state": "STARTED",
            "createdAt": 0,
            "updatedAt": 0,
        }
        return {"application": {**application, **({"monitoringConfiguration": monitoring} if monitoring else {})}}

    def job_run(self, state: str) -> dict:
        run = {
            "applicationId": EMR_APPLICATION_ID,
            "jobRunId": JOB_RUN_ID,
            "arn": self.job_run_arn,
            "createdBy": "arn:aws:sts::123456789012:assumed-role/ddb-athena-DagsterRunRole/task",
            "createdAt": 0,
            "updatedAt": 0,
            "executionRole": EMR_ROLE_ARN,
            "state": state,
            "stateDetails": "running" if state == "RUNNING" else "done",
            "releaseLabel": self.release,
            "jobDriver": self.started["jobDriver"],
            "configurationOverrides": self.started["configurationOverrides"],
        }
        return {"jobRun": run}

    def _started(self, params: dict, then_interrupt: bool) -> None:
        self.started = params
        ids = {"applicationId": EMR_APPLICATION_ID, "jobRunId": JOB_RUN_ID}
        if then_interrupt:
            # The run is terminated while it waits for the job: Dagster's interrupt lands in the polling loop.
            self.client.meta.events.register("after-call.emr-serverless.GetJobRun", self._interrupt)
            self.stubber.add_response("get_job_run", self.job_run("RUNNING"), ids)
            self.stubber.add_response("cancel_job_run", ids, ids)
            return
        self.stubber.add_response("get_job_run", self.job_run("RUNNING"), ids)
        self.stubber.add_response("get_dashboard_for_job_run", {"url": "https://emr-serverless-dashboard.example/job"}, ids)
        self.client.meta.events.register("before-parameter-build.emr-serverless.GetJobRun", self._run_once)
        self.stubber.add_response("get_job_run", self.job_run("SUCCESS"), ids)
        self.stubber.add_response("get_application", self.application(), {"applicationId": EMR_APPLICATION_ID})

    @staticmethod
    def _interrupt(**_):
        raise DagsterExecutionInterruptedError()

    def _run_once(self, **_):
        if not self.job_ran:
            self.job_ran = True
            self.run_the_job()

    def run_the_job(self) -> None:
        parameters = self.started["jobDriver"]["sparkSubmit"]["sparkSubmitParameters"]
        driver_env = dict(re.findall(r"--conf spark\.emr-serverless\.driverEnv\.(\w+)=(\S+)", parameters))
        # The local catalog and JARs in place of EMR's Glue and Iceberg runtime; s3:// through S3A, as on EMR's own file system.
        config = {**self.local_spark.spark_config(with_credentials=False), "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
        environment = {**os.environ, **spark_home_environment(), **self.local_spark.credential_environment(), **driver_env}
        job = subprocess.run(spark_submit_command(config, ENTRY_POINT), env=environment, capture_output=True, text=True)
        assert job.returncode == 0, failure_of(job.stderr)
        logs = self.settings.client("logs")
        stream = f"/applications/{EMR_APPLICATION_ID}/jobs/{JOB_RUN_ID}/SPARK_DRIVER/stdout"
        logs.create_log_stream(logGroupName=EMR_LOG_GROUP, logStreamName=stream)
        now = int(time.time() * 1000)
        lines = [line for line in job.stdout.splitlines() if line.strip()]
        logs.put_log_events(logGroupName=EMR_LOG_GROUP, logStreamName=stream, logEvents=[{"timestamp": now, "message": line} for line in lines])


class StubbedEmrAws(AwsClientsResource):
    """The run's AWS clients, with EMR Serverless the stub's."""

    def client(self, service: str):
        return EMR_STUB[0].client if service == "emr-serverless" else super().client(service)


EMR_STUB: list[EmrServerless] = []


@pytest.fixture
def emr(settings, tmp_path, monkeypatch):
    """What the stack and `make emr-job` provide: the code in S3, the log group; and the stubbed service."""
    s3 = settings.client("s3")
    s3.create_bucket(Bucket=CODE_BUCKET)
    for path in build_emr_job(tmp_path / "emr"):
        s3.upload_file(str(path), CODE_BUCKET, f"{CODE_PREFIX}/{path.name}")
    settings.client("logs").create_log_group(logGroupName=EMR_LOG_GROUP)
    local_spark = resources_from_settings(settings)["spark"]
    stub = EmrServerless(settings, local_spark)
    EMR_STUB[:] = [stub]
    with stub.stubber:
        yield stub


def emr_resources(settings: Settings) -> dict:
    base = resources_from_settings(settings)
    aws = base["aws"]
    return {
        "aws": StubbedEmrAws(region_name=aws.region_name, endpoint_url=aws.endpoint_url, aws_access_key_id="testing", aws_secret_access_key="testing"),
        # The aws profile's Spark settings (Glue, S3FileIO, s3://) go into the request; no session is started here.
        "spark": IcebergSparkResource(profile="aws", warehouse="s3://test-bucket/warehouse", master=None),
        "orders_load": ExportLoadRunner(
            modes={"orders": "emr_serverless"},
            emr_application_id=EMR_APPLICATION_ID,
            emr_execution_role_arn=EMR_ROLE_ARN,
            emr_code_uri=f"s3://{CODE_BUCKET}/{CODE_PREFIX}",
            emr_log_group=EMR_LOG_GROUP,
            emr_timeout_minutes=90,
        ),
    }


def test_a_partition_loaded_on_emr_serverless_is_the_in_process_load(days, spark, settings, instance, loaded_in_process, emr, monkeypatch):
    reference, reference_table = loaded_in_process
    emr.expect_a_job()
    result = load_again_into(f"{settings.namespace}_emr", days.yesterday, instance, monkeypatch, emr_resources(settings))
    emr.stubber.assert_no_pending_responses()
    metadata = materialization_metadata(result, "orders_athena")
    assert metadata["load_ran"] == "emr_serverless" and metadata["AWS EMR Serverless Job Run ID"] == JOB_RUN_ID
    assert_same_load(spark, reference, reference_table, result, f"{settings.namespace}_emr.orders")

    request = emr.started
    assert request["applicationId"] == EMR_APPLICATION_ID and request["executionRoleArn"] == EMR_ROLE_ARN
    assert request["clientToken"] == result.run_id and request["executionTimeoutMinutes"] == 90
    assert request["tags"]["dagster/run-id"] == result.run_id
    driver = request["jobDriver"]["sparkSubmit"]
    assert driver["entryPoint"] == f"s3://{CODE_BUCKET}/{CODE_PREFIX}/orders_load_job.py"
    parameters = driver["sparkSubmitParameters"]
    assert parameters.startswith(f"--py-files s3://{CODE_BUCKET}/{CODE_PREFIX}/ddb_athena_job.zip ")
    assert "--conf spark.sql.catalog.lake.catalog-impl=org.apache.iceberg.aws.glue.GlueCatalog" in parameters
    assert "--conf spark.jars=/usr/share/aws/iceberg/lib/iceberg-spark3-runtime.jar" in parameters
    # Pipes' bootstrap environment for the driver (dagster-aws adds it), and no key of any kind.
    assert "spark.emr-serverless.driverEnv.DAGSTER_PIPES_CONTEXT=" in parameters and "spark.emr-serverless.driverEnv.DAGSTER_PIPES_MESSAGES=" in parameters
    assert "testing" not in parameters and "access.key" not in parameters and "spark.master" not in parameters
    logging = request["configurationOverrides"]["monitoringConfiguration"]["cloudWatchLoggingConfiguration"]
    assert logging["enabled"] is True and logging["logGroupName"] == EMR_LOG_GROUP


def test_terminating_the_run_cancels_the_job_run(days, settings, instance, loaded_in_process, emr, monkeypatch):
    emr.expect_a_job(then_interrupt=True)
    result = load_again_into(f"{settings.namespace}_emr", days.yesterday, instance, monkeypatch, emr_resources(settings), raise_on_error=False)
    assert not result.success
    emr.stubber.assert_no_pending_responses()  # the last one is CancelJobRun of the job run started


def test_an_application_on_another_release_or_missing_code_starts_no_job(days, settings, instance, loaded_in_process, emr, monkeypatch):
    emr.release = "emr-6.15.0"
    emr.expect_the_release_check()
    with pytest.raises(JobSubmissionError, match="runs emr-6.15.0, but the job is built for emr-7.12.0"):
        load_again_into(f"{settings.namespace}_emr", days.yesterday, instance, monkeypatch, emr_resources(settings))
    emr.release = "emr-7.12.0"
    emr.expect_the_release_check()
    settings.client("s3").delete_object(Bucket=CODE_BUCKET, Key=f"{CODE_PREFIX}/ddb_athena_job.zip")
    with pytest.raises(JobSubmissionError, match="ddb_athena_job.zip cannot be read .*make emr-job"):
        load_again_into(f"{settings.namespace}_emr", days.yesterday, instance, monkeypatch, emr_resources(settings))


def test_a_job_reads_its_lease_again_when_the_holder_renews_it_during_the_read():
    """S3A fails a read whose object changed since it was opened: the launching run renews the lease meanwhile."""
    from ddb_athena.exported.orders_load_job import LEASE_READ_ATTEMPTS, _lease_body

    class Renewing:
        """A session whose reads of the lease fail `failures` times as S3A does when the object changes, then read it."""

        def __init__(self, failures: int):
            self.failures, self.reads = failures, 0
            self.read = self

        def text(self, uri: str):
            return self

        def collect(self):
            self.reads += 1
            if self.reads <= self.failures:
                raise RuntimeError("org.apache.hadoop.fs.s3a.RemoteFileChangedException: open `s3a://b/_writer_leases/t.json': Change reported by S3")
            return [SimpleNamespace(value='{"holder": "run"}')]

    renewing = Renewing(failures=LEASE_READ_ATTEMPTS - 1)
    assert _lease_body(renewing, "s3a://b/_writer_leases/t.json") == {"holder": "run"} and renewing.reads == LEASE_READ_ATTEMPTS
    with pytest.raises(RuntimeError, match="RemoteFileChangedException"):
        _lease_body(Renewing(failures=LEASE_READ_ATTEMPTS), "s3a://b/_writer_leases/t.json")
    other = Renewing(failures=0)
    other.collect = lambda: (_ for _ in ()).throw(RuntimeError("Access Denied"))
    with pytest.raises(RuntimeError, match="Access Denied"):
        _lease_body(other, "s3a://b/_writer_leases/t.json")
