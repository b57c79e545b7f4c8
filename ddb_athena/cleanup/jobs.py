"""The cleanup jobs the sensor requests: they delete exactly the source files that successful materializations
consumed (a streamed table's change files, an exported table's export files)."""

from dagster import Config, JobDefinition, OpExecutionContext, job, op
from pydantic import Field

from ddb_athena.lib.declarations import TableDeclaration, declared_tables
from ddb_athena.lib.resources import AwsClientsResource
from ddb_athena.streamed.capture.commit_manifests import delete_committed_files

# One cleanup run per table at a time (dagster.yaml).
CLEANUP_TAG = "ddb_athena/cleanup"
# On ECS (deploy/dagster.yaml's run launcher): a cleanup is boto3 deletes, no Spark, so it takes Fargate's smallest task,
# a quarter vCPU and 0.5 GB (its process peaked at 147 MiB: `/usr/bin/time -v dagster job execute -j books_source_cleanup`,
# the code location loaded as a run worker loads it); every other run takes the instance's default, the sync's size.
SMALL_TASK_TAGS = {"ecs/cpu": "256", "ecs/memory": "512"}


class CleanupConfig(Config):
    bucket: str = Field(description="bucket of the manifests")
    manifest_keys: list[str] = Field(description="commit manifests written by the materializations, oldest first")


def _delete_committed_source_files(context: OpExecutionContext, config: CleanupConfig, aws: AwsClientsResource) -> int:
    deleted = 0
    for manifest_key in config.manifest_keys:
        deleted += delete_committed_files(aws.client("s3"), config.bucket, manifest_key)
    context.log.info(f"Deleted {deleted} committed files listed in {len(config.manifest_keys)} manifests in s3://{config.bucket}/")
    return deleted


DELETE_DESCRIPTION = "Deletes exactly the source files that successful materializations consumed."
# A streamed table's change files are never read again once committed: their cleanup never waits for the hour-long sync.
delete_committed_change_files = op(name="delete_committed_change_files", description=DELETE_DESCRIPTION)(_delete_committed_source_files)


def cleanup_job(name: str, description: str, delete) -> JobDefinition:
    @job(name=name, description=f"{description} (requested by the cleanup sensor).", tags=SMALL_TASK_TAGS)
    def cleanup():
        delete()

    return cleanup


SOURCE_CLEANUPS = {
    name: cleanup_job(table.cleanup_job, f"Deletes the {name} change files that commits consumed", delete_committed_change_files)
    for name, table in declared_tables().items()
    if table.kind == "streamed"
}


def export_cleanup_job(table: TableDeclaration) -> JobDefinition:
    # A re-run of a partition re-uses its export's files: their cleanup waits in the table's writers' queue.
    delete_loaded_export_files = op(name=f"delete_loaded_{table.name}_export_files", description=DELETE_DESCRIPTION, pool=table.writer_pool)(
        _delete_committed_source_files
    )
    description = f"Deletes the {table.name} export files that loads consumed, after their retention"
    return cleanup_job(table.cleanup_job, description, delete_loaded_export_files)


EXPORT_CLEANUPS = {name: export_cleanup_job(table) for name, table in declared_tables().items() if table.kind == "exported"}
