"""Configuration from environment variables, with defaults that work on the local stack."""

import functools
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from ddb_athena.lake.identifiers import validate_identifier
from ddb_athena.lib.declarations import declared_tables

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCAL_STATE_DIR = REPO_ROOT / ".ddb_athena"
LOCAL_STACK_PORT = 5055
LOCAL_ENDPOINT_URL = f"http://127.0.0.1:{LOCAL_STACK_PORT}"
# moto accepts any credentials; these make boto3 work locally with nothing configured.
LOCAL_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}

PROFILES = ("local", "aws")
# A setting's environment variable is this prefix and its name in capitals (DDB_ATHENA_MERGE_INTERVAL_SECONDS).
SETTING_PREFIX = "DDB_ATHENA_"
ORDERS_LOAD_MODES = ("in_process", "spark_submit", "emr_serverless")
# The EMR Serverless job's settings (the stack's outputs), by the name the orders load runner gives them.
EMR_SETTINGS = {
    "emr_application_id": "DDB_ATHENA_EMR_APPLICATION_ID",
    "emr_execution_role_arn": "DDB_ATHENA_EMR_EXECUTION_ROLE_ARN",
    "emr_code_uri": "DDB_ATHENA_EMR_CODE_URI",
    "emr_log_group": "DDB_ATHENA_EMR_LOG_GROUP",
    "emr_release_label": "DDB_ATHENA_EMR_RELEASE_LABEL",
    "emr_python": "DDB_ATHENA_EMR_PYTHON",
    "emr_timeout_minutes": "DDB_ATHENA_EMR_TIMEOUT_MINUTES",
}
EMR_REQUIRED = ("emr_application_id", "emr_execution_role_arn", "emr_code_uri", "emr_log_group")
NAMESPACE = "library"
# The data stack's choices for the code (who reads the streams, the capture's failure queues, where the orders load
# runs and its EMR application), in one SSM parameter the stack writes (deploy/ddb_athena.yaml): an export would
# freeze them while another stack imports it. Read once a process, under the process's own variables, which win.
STACK_SETTINGS_VARIABLE = "DDB_ATHENA_STACK_SETTINGS_PARAMETER"
DEFAULT_ORDERS_START_DATE = "2026-11-01"
DEFAULT_ORDERS_SCHEDULE_HOUR = 2
# The key parity check scans the user's DynamoDB table: once a day, at this hour (UTC).
DEFAULT_PARITY_SCAN_HOUR = 3
# Every cleanup run is a process of its own (a few CPU-seconds of imports): one every few minutes, not every
# minute. Committed files waiting for it cost nothing: the sync skips them.
DEFAULT_CLEANUP_INTERVAL_SECONDS = 300
MIN_CLEANUP_INTERVAL_SECONDS = 30
# The books sync cycle, the dial of the bill (docs/cost.md): the cheapest interval measured to keep changes in Athena
# within a minute with room (p95 under a minute over 30 minutes at 230 writes a second, upkeep passes included); above
# a minute the promise of a minute or two, and the 2-minute backlog check, no longer hold.
DEFAULT_MERGE_INTERVAL_SECONDS = 30.0
# A quiet table's cycles back off to this: its first change then waits up to this long, plus a cycle.
DEFAULT_LONGEST_MERGE_INTERVAL_SECONDS = 45.0
# A writer renews its table's lease a few times within this; a dead writer's lease expires this long after its last
# renewal, so a successor (a crashed sync's replacement) waits up to that long. Each renewal is an S3 PUT (every 20 s:
# 0.65 USD a month, docs/cost.md); the commit's own fence, not the lease's timing, stops a writer that lost it.
DEFAULT_WRITER_LEASE_SECONDS, MIN_WRITER_LEASE_SECONDS, MAX_WRITER_LEASE_SECONDS = 60.0, 5.0, 600.0
# A writer that makes no progress this long (no step of its own, no Spark task completed) stops renewing its lease, so a
# hung run does not hold the table: ten cycles at the longest interval, and longer than a Spark task of a big load.
DEFAULT_WRITER_STALL_SECONDS, MIN_WRITER_STALL_SECONDS, MAX_WRITER_STALL_SECONDS = 300.0, 60.0, 7200.0
# A day at most: a run's max runtime (its length plus slack) is how long a hung one holds the books writer.
DEFAULT_SYNC_RUN_MINUTES, MAX_SYNC_RUN_MINUTES = 60.0, 1440.0


class SettingsError(ValueError):
    """The environment describes a configuration that cannot work."""


def _start_date(text: str) -> str:
    try:
        return date.fromisoformat(text).isoformat()
    except ValueError:
        raise SettingsError(f"DDB_ATHENA_ORDERS_START_DATE={text!r}: expected a date like 2026-11-01") from None


def _hour(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name, str(default))
    if not text.isdigit() or not 0 <= int(text) <= 23:
        raise SettingsError(f"{name}={text!r}: expected an hour of the day, 0 to 23 (UTC)")
    return int(text)


def _memory_size(env: Mapping[str, str], name: str) -> str | None:
    """A JVM memory size (`1536m`, `2g`), or None when unset."""
    text = env.get(name) or None
    if text is not None and not re.fullmatch(r"[1-9][0-9]*[mMgG]", text):
        raise SettingsError(f"{name}={text!r}: expected a JVM memory size like 1536m or 2g")
    return text


def _cleanup_interval(text: str) -> int:
    if not text.isdigit() or int(text) < MIN_CLEANUP_INTERVAL_SECONDS:
        raise SettingsError(f"DDB_ATHENA_CLEANUP_INTERVAL_SECONDS={text!r}: expected whole seconds, at least {MIN_CLEANUP_INTERVAL_SECONDS}")
    return int(text)


def _number_between(env: Mapping[str, str], name: str, default: float, low: float, high: float, unit: str) -> float:
    """`env[name]` as a number from `low` to `high`, `default` when unset."""
    text = env.get(name, str(default))
    try:
        number = float(text)
    except ValueError:
        number = float("nan")
    if not low <= number <= high:
        raise SettingsError(f"{name}={text!r}: expected {unit} from {low:g} to {high:g}")
    return number


@dataclass(frozen=True)
class Settings:
    profile: str
    bucket: str
    warehouse: str
    region: str
    # Every declared table's DynamoDB table, by its declared name.
    dynamodb_tables: Mapping[str, str] = field(default_factory=dict)
    namespace: str = NAMESPACE
    credentials: Mapping[str, str] = field(default_factory=dict)
    # Set only when the endpoint is our local default rather than boto3's own variables.
    default_endpoint_url: str | None = None
    # boto3's AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_<SERVICE> variables, as read.
    endpoint_environ: Mapping[str, str] = field(default_factory=dict)
    spark_master: str | None = "local[2]"
    spark_packages: str | None = None
    spark_driver_memory: str | None = None
    orders_start_date: str = DEFAULT_ORDERS_START_DATE
    orders_schedule_hour: int = DEFAULT_ORDERS_SCHEDULE_HOUR
    parity_scan_hour: int = DEFAULT_PARITY_SCAN_HOUR
    cleanup_interval_seconds: int = DEFAULT_CLEANUP_INTERVAL_SECONDS
    writer_lease_seconds: float = DEFAULT_WRITER_LEASE_SECONDS
    writer_stall_seconds: float = DEFAULT_WRITER_STALL_SECONDS
    orders_load: str = "in_process"
    # Only the EMR settings the environment sets; the runner's defaults stand for the rest.
    emr: Mapping[str, str] = field(default_factory=dict)
    # Every DDB_ATHENA_ variable as read: the sync resource takes its fields from them (resources.sync_settings), and
    # validates them there, once.
    environ: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_local(self) -> bool:
        return self.profile == "local"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        env = with_stack_settings(os.environ if environ is None else environ)
        profile = env.get("DDB_ATHENA_PROFILE", "local")
        if profile not in PROFILES:
            raise SettingsError(f"DDB_ATHENA_PROFILE={profile!r}: expected one of {', '.join(PROFILES)}")
        local = profile == "local"
        orders_load = env.get("DDB_ATHENA_ORDERS_LOAD", "in_process")
        if orders_load not in ORDERS_LOAD_MODES:
            raise SettingsError(f"DDB_ATHENA_ORDERS_LOAD={orders_load!r}: expected one of {', '.join(ORDERS_LOAD_MODES)}")
        emr = {name: env[variable] for name, variable in EMR_SETTINGS.items() if env.get(variable)}
        missing = [EMR_SETTINGS[name] for name in EMR_REQUIRED if name not in emr]
        if orders_load == "emr_serverless" and local:
            raise SettingsError("DDB_ATHENA_ORDERS_LOAD=emr_serverless needs DDB_ATHENA_PROFILE=aws: a job on EMR cannot reach the local emulator")
        if orders_load == "emr_serverless" and missing:
            raise SettingsError(
                f"DDB_ATHENA_ORDERS_LOAD=emr_serverless needs {', '.join(missing)}: the stack's outputs "
                "(docs/operations.md, 'Loading orders on EMR Serverless')"
            )
        bucket = env.get("DDB_ATHENA_BUCKET", "ddb-athena-local")
        default_endpoint_url = LOCAL_ENDPOINT_URL if local and not env.get("AWS_ENDPOINT_URL") else None
        if local:
            warehouse = env.get("DDB_ATHENA_WAREHOUSE") or (LOCAL_STATE_DIR / "warehouse").as_uri()
        else:
            warehouse = env.get("DDB_ATHENA_WAREHOUSE") or f"s3://{bucket}/warehouse"
            if not warehouse.startswith("s3://"):
                raise SettingsError(f"DDB_ATHENA_WAREHOUSE={warehouse!r}: the aws profile needs an s3:// URI")
        credentials = {}
        if local and not env.get("AWS_ACCESS_KEY_ID"):
            credentials = dict(LOCAL_CREDENTIALS)
        return cls(
            profile=profile,
            bucket=bucket,
            warehouse=warehouse,
            # As declared (ddb_athena/tables.toml), or named by the declaration's variable: DynamoDB table names allow '-'
            # and '.', which never reach SQL.
            dynamodb_tables={name: table.dynamodb_table_name(env) for name, table in declared_tables().items()},
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            namespace=validate_identifier(env.get("DDB_ATHENA_NAMESPACE", NAMESPACE), "namespace"),
            credentials=credentials,
            default_endpoint_url=default_endpoint_url,
            endpoint_environ={name: value for name, value in env.items() if name.startswith("AWS_ENDPOINT_URL") and value},
            # On a cluster the launcher sets the master; locally Spark runs in this process.
            spark_master=env.get("DDB_ATHENA_SPARK_MASTER") or ("local[2]" if local else None),
            spark_packages=env.get("DDB_ATHENA_SPARK_PACKAGES") or None,
            spark_driver_memory=_memory_size(env, "DDB_ATHENA_SPARK_DRIVER_MEMORY"),
            orders_start_date=_start_date(env.get("DDB_ATHENA_ORDERS_START_DATE", DEFAULT_ORDERS_START_DATE)),
            orders_schedule_hour=_hour(env, "DDB_ATHENA_ORDERS_SCHEDULE_HOUR", DEFAULT_ORDERS_SCHEDULE_HOUR),
            parity_scan_hour=_hour(env, "DDB_ATHENA_PARITY_SCAN_HOUR", DEFAULT_PARITY_SCAN_HOUR),
            orders_load=orders_load,
            emr=emr,
            cleanup_interval_seconds=_cleanup_interval(env.get("DDB_ATHENA_CLEANUP_INTERVAL_SECONDS", str(DEFAULT_CLEANUP_INTERVAL_SECONDS))),
            writer_lease_seconds=_number_between(
                env, "DDB_ATHENA_WRITER_LEASE_SECONDS", DEFAULT_WRITER_LEASE_SECONDS, MIN_WRITER_LEASE_SECONDS, MAX_WRITER_LEASE_SECONDS, "seconds"
            ),
            writer_stall_seconds=_number_between(
                env, "DDB_ATHENA_WRITER_STALL_SECONDS", DEFAULT_WRITER_STALL_SECONDS, MIN_WRITER_STALL_SECONDS, MAX_WRITER_STALL_SECONDS, "seconds"
            ),
            environ={name: value for name, value in env.items() if name.startswith(SETTING_PREFIX) and value},
        )

    @property
    def endpoint_url(self) -> str | None:
        return self.endpoint_environ.get("AWS_ENDPOINT_URL") or self.default_endpoint_url

    @property
    def s3_endpoint_url(self) -> str | None:
        return self.endpoint_for("s3")

    def endpoint_for(self, service: str) -> str | None:
        """The endpoint boto3 would pick from these variables (its own lookup), else the local default."""
        from botocore.configprovider import ConfiguredEndpointProvider

        lookup = ConfiguredEndpointProvider(full_config={}, scoped_config={}, client_name=service, environ=self.endpoint_environ)
        return lookup.provide() or self.default_endpoint_url

    def client(self, service: str):
        """A boto3 client for `service`, with the endpoint these settings were read with."""
        import boto3

        kwargs = {"region_name": self.region}
        if self.credentials:
            kwargs["aws_access_key_id"] = self.credentials["AWS_ACCESS_KEY_ID"]
            kwargs["aws_secret_access_key"] = self.credentials["AWS_SECRET_ACCESS_KEY"]
        endpoint = self.endpoint_for(service)
        if endpoint:
            kwargs["endpoint_url"] = endpoint
        return boto3.client(service, **kwargs)


def with_stack_settings(env: Mapping[str, str]) -> Mapping[str, str]:
    """`env` over the data stack's settings, if it names their parameter (STACK_SETTINGS_VARIABLE)."""
    parameter = env.get(STACK_SETTINGS_VARIABLE)
    if not parameter:
        return env
    return {**_stack_settings(parameter, env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")), **env}


@functools.cache
def _stack_settings(parameter: str, region: str | None) -> dict[str, str]:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        value = boto3.client("ssm", region_name=region).get_parameter(Name=parameter)["Parameter"]["Value"]
        stack = json.loads(value)
    except (BotoCoreError, ClientError) as error:
        raise SettingsError(f"{STACK_SETTINGS_VARIABLE}={parameter!r}: the data stack's settings could not be read ({error})") from None
    except json.JSONDecodeError:
        raise SettingsError(f"{STACK_SETTINGS_VARIABLE}={parameter!r}: not a JSON object") from None
    if not isinstance(stack, dict):
        raise SettingsError(f"{STACK_SETTINGS_VARIABLE}={parameter!r}: not a JSON object")
    foreign = sorted(name for name in stack if not name.startswith(SETTING_PREFIX) or name == STACK_SETTINGS_VARIABLE)
    if foreign:
        raise SettingsError(f"{STACK_SETTINGS_VARIABLE}={parameter!r}: holds {', '.join(foreign)}; only {SETTING_PREFIX}* settings")
    return {name: value if isinstance(value, str) else json.dumps(value) for name, value in stack.items()}
