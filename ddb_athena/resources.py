"""Every resource of the code location, from the settings: what definitions.py binds, and what the CLI, the
benchmarks and the tests build the same way."""

from ddb_athena.exported.load_runner import export_load_runner
from ddb_athena.lib.resources import AwsClientsResource, IcebergSparkResource, WriterLeases, sync_settings
from ddb_athena.lib.settings import Settings


def resources_from_settings(settings: Settings, **sync_options) -> dict:
    credentials = settings.credentials or {}
    return {
        "aws": AwsClientsResource(
            region_name=settings.region,
            endpoint_url=settings.default_endpoint_url,
            aws_access_key_id=credentials.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=credentials.get("AWS_SECRET_ACCESS_KEY"),
        ),
        "spark": IcebergSparkResource(
            profile=settings.profile,
            warehouse=settings.warehouse,
            master=settings.spark_master,
            jars_packages=settings.spark_packages,
            s3_endpoint_url=settings.s3_endpoint_url,
            region=settings.region,
            access_key_id=credentials.get("AWS_ACCESS_KEY_ID"),
            secret_access_key=credentials.get("AWS_SECRET_ACCESS_KEY"),
            extra_config={"spark.driver.memory": settings.spark_driver_memory} if settings.spark_driver_memory else {},
        ),
        "orders_load": export_load_runner(settings),
        "leases": WriterLeases(ttl_seconds=settings.writer_lease_seconds, stall_seconds=settings.writer_stall_seconds),
        "sync": sync_settings(settings, **sync_options),
    }
