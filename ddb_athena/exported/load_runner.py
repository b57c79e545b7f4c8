"""Where an exported table's Spark load runs (the `orders_load` resource, named when orders was the only exported
table): in the run process, as a spark-submit job on this machine, or on EMR Serverless."""

from collections.abc import Callable
from pathlib import Path

from dagster import AssetExecutionContext, ConfigurableResource, PipesSubprocessClient
from dagster_aws.pipes import PipesCloudWatchMessageReader, PipesEMRServerlessClient
from pydantic import Field, field_validator

import ddb_athena.exported.orders_load_job as orders_load_job
from ddb_athena.exported.partition_load import ExportLoadOutcome, ExportLoadRequest, load_export_partition
from ddb_athena.lake.job_submission import (
    EmrServerlessJob,
    JobSubmissionError,
    emr_spark_config,
    spark_home_environment,
    spark_submit_command,
    start_job_run_params,
)
from ddb_athena.lib.declarations import LOAD_MODES
from ddb_athena.lib.resources import AwsClientsResource, IcebergSparkResource
from ddb_athena.lib.settings import Settings

# Where an exported table's Spark load runs: in the run process (the default), as a spark-submit job on this machine,
# or on EMR Serverless. Both jobs run ddb_athena/exported/orders_load_job.py through Dagster Pipes and return the same
# ExportLoadOutcome as the run process, so the asset's metadata and checks cannot tell them apart.
ENTRY_POINT = Path(orders_load_job.__file__)


class ExportLoadRunner(ConfigurableResource):
    """Runs an exported table's load where its mode says; the EMR Serverless settings are the stack's outputs."""

    # Dagster's config takes a dict of plain strings: the validator below keeps them to the modes.
    modes: dict[str, str] = Field(
        default_factory=dict,
        description="where each exported table's load runs, by its name: in_process (the run's SparkSession), spark_submit (a "
        "local job) or emr_serverless (its declaration's load, or DDB_ATHENA_<NAME>_LOAD); unset: in_process",
    )
    emr_application_id: str | None = Field(default=None, description="EMR Serverless application (SparkApplicationId)")
    emr_execution_role_arn: str | None = Field(default=None, description="the job's role (SparkJobRoleArn)")
    emr_release_label: str = Field(default="emr-7.12.0", description="the release the job is built for; the application must run it")
    emr_code_uri: str | None = Field(default=None, description=f"s3:// prefix holding {ENTRY_POINT.name} and {orders_load_job.JOB_ARCHIVE_NAME}")
    emr_log_group: str | None = Field(default=None, description="CloudWatch log group of the job's driver (SparkLogGroupName)")
    emr_python: str = Field(default="/usr/bin/python3.11", description="the image's Python (3.10 or later) for driver and executors")
    emr_timeout_minutes: int = Field(default=180, ge=1, description="EMR Serverless cancels the job after this long")

    @field_validator("modes")
    @classmethod
    def _known_modes(cls, modes: dict[str, str]) -> dict[str, str]:
        unknown = {table: mode for table, mode in modes.items() if mode not in LOAD_MODES}
        if unknown:
            raise ValueError(f"{unknown}: a load runs {', '.join(LOAD_MODES)}")
        return modes

    def mode_of(self, table: str) -> str:
        return self.modes.get(table, "in_process")

    def emr_job(self) -> EmrServerlessJob:
        return EmrServerlessJob(
            application_id=self.emr_application_id or "",
            execution_role_arn=self.emr_execution_role_arn or "",
            code_uri=self.emr_code_uri or "",
            entry_point=ENTRY_POINT.name,
            archive=orders_load_job.JOB_ARCHIVE_NAME,
            log_group=self.emr_log_group or "",
            python=self.emr_python,
            timeout_minutes=self.emr_timeout_minutes,
        )

    def load(
        self,
        context: AssetExecutionContext,
        request: ExportLoadRequest,
        spark: IcebergSparkResource,
        aws: AwsClientsResource,
        before_commit: Callable[[], None],
    ) -> tuple[ExportLoadOutcome, dict]:
        """The outcome, and what the job platform adds to the metadata (e.g. the EMR Serverless job run id). In this
        process `before_commit` guards the commit; a job checks the request's writer lease itself."""
        mode = self.mode_of(request.table)
        if mode == "in_process":
            return load_export_partition(spark.spark_session, request, before_commit), {}
        before_commit()
        extras = {orders_load_job.REQUEST_EXTRA: request.to_json()}
        if mode == "spark_submit":
            # Credentials reach the job through its environment (S3A reads them there), never its command line.
            command = spark_submit_command(spark.spark_config(with_credentials=False), ENTRY_POINT)
            environment = {**spark_home_environment(), **spark.credential_environment()}
            invocation = PipesSubprocessClient(env=environment).run(command=command, context=context, extras=extras)
        else:
            invocation = PipesEMRServerlessClient(
                client=aws.client("emr-serverless"),
                message_reader=PipesCloudWatchMessageReader(client=aws.client("logs")),
                forward_termination=True,
            ).run(context=context, start_job_run_params=self.emr_request(context, spark, aws), extras=extras)
        result = invocation.get_materialize_result()
        reported = {name: value.value for name, value in (result.metadata or {}).items()}
        outcome = ExportLoadOutcome.from_json(reported.pop(orders_load_job.OUTCOME_METADATA))
        return outcome, reported

    def emr_request(self, context: AssetExecutionContext, spark: IcebergSparkResource, aws: AwsClientsResource) -> dict:
        job = self.emr_job()
        application = aws.client("emr-serverless").get_application(applicationId=job.application_id)["application"]
        if application["releaseLabel"] != self.emr_release_label:
            raise JobSubmissionError(
                f"EMR Serverless application {job.application_id} runs {application['releaseLabel']}, but the job is built for "
                f"{self.emr_release_label} (DDB_ATHENA_EMR_RELEASE_LABEL): upgrade the application or change the setting"
            )
        s3 = aws.client("s3")
        for uri in (job.code(job.entry_point), job.code(job.archive)):
            bucket, _, key = uri.removeprefix("s3://").partition("/")
            try:
                s3.head_object(Bucket=bucket, Key=key)
            except s3.exceptions.ClientError as error:
                raise JobSubmissionError(
                    f"{uri} cannot be read ({error.response['Error']['Code']}): build it with `make emr-job` and upload it "
                    "(docs/operations.md, 'Loading orders on EMR Serverless')"
                ) from None
        return start_job_run_params(
            job,
            # The cluster's configuration: no master, no local JARs or packages, no keys (the job role's credentials).
            emr_spark_config(spark.model_copy(update={"master": None}).spark_config(with_credentials=False), job.python),
            name=f"ddb_athena {context.asset_key.to_user_string()} {context.partition_key}",
            client_token=context.run.run_id,
        )


def export_load_runner(settings: Settings) -> ExportLoadRunner:
    runner = ExportLoadRunner(modes={name: table.load for name, table in settings.exported.items()}, **settings.emr)
    if "emr_serverless" in runner.modes.values():
        runner.emr_job()  # a malformed setting fails when the code location loads, not in the night's run
    return runner
