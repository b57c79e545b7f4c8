"""Configuration from environment variables, with defaults that work on the local stack."""

import functools
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError, field_validator
from pydantic_settings import EnvSettingsSource
from pydantic_settings import SettingsError as PydanticSettingsError
from pydantic_settings.sources.utils import parse_env_vars

from ddb_athena.lake.identifiers import validate_identifier
from ddb_athena.lib.declarations import DECLARATIONS_FILE, LOAD_MODES, TableDeclaration, declared_tables

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCAL_STATE_DIR = REPO_ROOT / ".ddb_athena"
LOCAL_STACK_PORT = 5055
LOCAL_ENDPOINT_URL = f"http://127.0.0.1:{LOCAL_STACK_PORT}"
# moto accepts any credentials; these make boto3 work locally with nothing configured.
LOCAL_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}

# A setting's environment variable is this prefix and its name in capitals (DDB_ATHENA_MERGE_INTERVAL_SECONDS).
SETTING_PREFIX = "DDB_ATHENA_"
# The EMR Serverless job's settings (the stack's outputs), by the name the load runner's fields give them.
EMR_SETTINGS = {
    name: SETTING_PREFIX + name.upper()
    for name in ("emr_application_id", "emr_execution_role_arn", "emr_code_uri", "emr_log_group", "emr_release_label", "emr_python", "emr_timeout_minutes")
}
EMR_REQUIRED = ("emr_application_id", "emr_execution_role_arn", "emr_code_uri", "emr_log_group")
NAMESPACE = "library"
# The data stack's choices for the code (who reads the streams, the capture's failure queues, where the orders load
# runs and its EMR application), in one SSM parameter the stack writes (deploy/ddb_athena.yaml): an export would
# freeze them while another stack imports it. Read once a process, under the process's own variables, which win.
STACK_SETTINGS_VARIABLE = "DDB_ATHENA_STACK_SETTINGS_PARAMETER"
# An exported table's first partition and schedule hour where neither its declaration nor its variables say.
DEFAULT_START_DATE = "2026-11-01"
DEFAULT_SCHEDULE_HOUR = 2
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


Model = TypeVar("Model", bound=BaseModel)


class SettingsError(ValueError):
    """The environment describes a configuration that cannot work."""


class _GivenEnvironment(EnvSettingsSource):
    """pydantic-settings' reading of a model's variables (`<prefix><FIELD>`, any case; JSON for a dict; empty as unset),
    from a given mapping: the process's environment over the stack's settings, or a test's."""

    def __init__(self, model: type[BaseModel], environ: Mapping[str, str], prefix: str) -> None:
        self._environ = environ
        super().__init__(model, env_prefix=prefix, case_sensitive=False, env_ignore_empty=True)  # type: ignore[arg-type]

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


def from_variables(model: type[Model], environ: Mapping[str, str], prefix: str = SETTING_PREFIX, **given) -> Model:
    """`model` with each field from its variable (`prefix` and the field's name in capitals) where `environ` sets it,
    else its declared default, `given` over both. Validated by the fields' declarations (type, bounds, pattern); a
    value they refuse is refused here naming its variable."""
    try:
        values = _GivenEnvironment(model, environ, prefix)()
    except PydanticSettingsError as error:
        field = re.search(r'field "([a-z0-9_]+)"', str(error))
        variable = prefix + (field.group(1).upper() if field else "?")
        raise SettingsError(f'{variable}={environ.get(variable)!r}: expected a JSON object like {{"books": "..."}}') from None
    values |= given
    try:
        return model(**values)
    except ValidationError as error:
        problems = []
        for problem in error.errors():
            field = str(problem["loc"][0]) if problem["loc"] else None
            where = f"{prefix}{field.upper()}={values.get(field)!r}: " if field else ""
            problems.append(where + problem["msg"].removeprefix("Value error, "))
        raise SettingsError("; ".join(problems)) from None


class DeploymentVariables(BaseModel):
    """The settings a process reads from DDB_ATHENA_<FIELD>, each declared once: default, bounds, meaning (the sync
    resource's are its own fields, lib/resources.py)."""

    profile: Literal["local", "aws"] = Field(
        default="local", description="local (a Hadoop catalog, the AWS emulator on this machine) or aws (the Glue catalog, the real services)"
    )
    bucket: str = Field(
        default="ddb-athena-local", description="the deployment's bucket: each table's source files under <name>_source/ or <name>_export/, the writer leases"
    )
    warehouse: str | None = Field(default=None, description="the Iceberg warehouse; unset: s3://<bucket>/warehouse on aws, .ddb_athena/warehouse locally")
    namespace: str = Field(default=NAMESPACE, description="the Iceberg namespace (the Glue database Athena reads)")
    spark_master: str | None = Field(
        default=None,
        description="spark.master; unset: local[2] locally, the launcher's on a cluster (with a local[...] master the JVM "
        "runs the parallel garbage collector, docs/operations.md)",
    )
    spark_packages: str | None = Field(default=None, description="spark.jars.packages instead of the local or the image's JARs (where Maven is reachable)")
    spark_driver_memory: str | None = Field(
        default=None,
        pattern=r"^[1-9][0-9]*[mMgG]$",
        description="the heap of Spark's JVM in the run worker, like 1536m or 2g (unset: Spark's 1g); deploy/dagster_ecs.yaml "
        "sets 1536m, the heap the bill's 0.5 vCPU / 3 GB task was measured with",
    )
    parity_scan_hour: int = Field(
        default=DEFAULT_PARITY_SCAN_HOUR, ge=0, le=23, description="the hour (UTC) of the daily key parity check, the one check that scans the DynamoDB table"
    )
    cleanup_interval_seconds: int = Field(
        default=DEFAULT_CLEANUP_INTERVAL_SECONDS,
        ge=MIN_CLEANUP_INTERVAL_SECONDS,
        description="how often the cleanup sensor starts one run for every commit since its last; each run is a process of its own",
    )
    writer_lease_seconds: float = Field(
        default=DEFAULT_WRITER_LEASE_SECONDS,
        ge=MIN_WRITER_LEASE_SECONDS,
        le=MAX_WRITER_LEASE_SECONDS,
        description="a writer's lease time to live: renewed every third of it; a dead writer's lease is taken over after it, by S3's clock",
    )
    writer_stall_seconds: float = Field(
        default=DEFAULT_WRITER_STALL_SECONDS,
        ge=MIN_WRITER_STALL_SECONDS,
        le=MAX_WRITER_STALL_SECONDS,
        description="a writer that makes no progress this long (no step of its own, no Spark task completed) stops renewing "
        "its lease, so a hung run does not hold its table",
    )

    @field_validator("namespace")
    @classmethod
    def _an_identifier(cls, namespace: str) -> str:
        return validate_identifier(namespace, "namespace")


class ExportedTableSettings(BaseModel):
    """An exported table's schedule and load: its declaration's, each overridden by its variable
    (DDB_ATHENA_<NAME>_START_DATE, _SCHEDULE_HOUR, _LOAD: orders' are the variables of before declarations held them)."""

    start_date: date = Field(default=date.fromisoformat(DEFAULT_START_DATE), description="its first daily partition (make dev: yesterday)")
    schedule_hour: int = Field(
        default=DEFAULT_SCHEDULE_HOUR, ge=0, le=23, description="the hour (UTC) its daily schedule (<name>_daily_schedule) loads the day that ended"
    )
    load: Literal[LOAD_MODES] = Field(
        default="in_process",
        description="where its load runs its Spark work: in_process, spark_submit or emr_serverless (docs/operations.md, 'Loading orders on EMR Serverless')",
    )  # type: ignore[valid-type]


def exported_table_settings(table: TableDeclaration, environ: Mapping[str, str]) -> ExportedTableSettings:
    declared = {name: getattr(table, name) for name in ExportedTableSettings.model_fields if getattr(table, name) is not None}
    overridden = from_variables(ExportedTableSettings, environ, f"{SETTING_PREFIX}{table.name.upper()}_")
    return overridden.model_copy(update={name: value for name, value in declared.items() if name not in overridden.model_fields_set})


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
    # Every exported table's schedule and load, by its declared name.
    exported: Mapping[str, ExportedTableSettings] = field(default_factory=dict)
    parity_scan_hour: int = DEFAULT_PARITY_SCAN_HOUR
    cleanup_interval_seconds: int = DEFAULT_CLEANUP_INTERVAL_SECONDS
    writer_lease_seconds: float = DEFAULT_WRITER_LEASE_SECONDS
    writer_stall_seconds: float = DEFAULT_WRITER_STALL_SECONDS
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
        variables = from_variables(DeploymentVariables, env)
        local = variables.profile == "local"
        tables = declared_tables()
        exported = {name: exported_table_settings(table, env) for name, table in tables.items() if table.kind == "exported"}
        emr = {name: env[variable] for name, variable in EMR_SETTINGS.items() if env.get(variable)}
        missing = [EMR_SETTINGS[name] for name in EMR_REQUIRED if name not in emr]
        for name, table in exported.items():
            if table.load != "emr_serverless":
                continue
            where = _load_setting(tables[name], env)
            if local:
                raise SettingsError(f"{where}=emr_serverless needs DDB_ATHENA_PROFILE=aws: a job on EMR cannot reach the local emulator")
            if missing:
                raise SettingsError(
                    f"{where}=emr_serverless needs {', '.join(missing)}: the stack's outputs (docs/operations.md, 'Loading orders on EMR Serverless')"
                )
        if local:
            warehouse = variables.warehouse or (LOCAL_STATE_DIR / "warehouse").as_uri()
        else:
            warehouse = variables.warehouse or f"s3://{variables.bucket}/warehouse"
            if not warehouse.startswith("s3://"):
                raise SettingsError(f"DDB_ATHENA_WAREHOUSE={warehouse!r}: the aws profile needs an s3:// URI")
        return cls(
            profile=variables.profile,
            bucket=variables.bucket,
            warehouse=warehouse,
            # As declared (ddb_athena/tables.toml), or named by the declaration's variable: DynamoDB table names allow '-'
            # and '.', which never reach SQL.
            dynamodb_tables={name: table.dynamodb_table_name(env) for name, table in tables.items()},
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            namespace=variables.namespace,
            credentials=dict(LOCAL_CREDENTIALS) if local and not env.get("AWS_ACCESS_KEY_ID") else {},
            default_endpoint_url=LOCAL_ENDPOINT_URL if local and not env.get("AWS_ENDPOINT_URL") else None,
            endpoint_environ={name: value for name, value in env.items() if name.startswith("AWS_ENDPOINT_URL") and value},
            # On a cluster the launcher sets the master; locally Spark runs in this process.
            spark_master=variables.spark_master or ("local[2]" if local else None),
            spark_packages=variables.spark_packages,
            spark_driver_memory=variables.spark_driver_memory,
            exported=exported,
            parity_scan_hour=variables.parity_scan_hour,
            emr=emr,
            cleanup_interval_seconds=variables.cleanup_interval_seconds,
            writer_lease_seconds=variables.writer_lease_seconds,
            writer_stall_seconds=variables.writer_stall_seconds,
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


def fields_table(model: type[BaseModel], heading: str, prefix: str = SETTING_PREFIX, skip: tuple[str, ...] = ()) -> str:
    """A model's fields as a Markdown table: each one's variable, default, bounds and meaning, as declared."""
    rows = [f"| {heading} | default | bounds | meaning |", "| --- | --- | --- | --- |"]
    for name, declared in model.model_fields.items():
        if name in skip:
            continue
        bounds = [
            f"{symbol} {getattr(rule, attribute):g}"
            for rule in declared.metadata
            for attribute, symbol in (("ge", "≥"), ("gt", ">"), ("le", "≤"))
            if hasattr(rule, attribute)
        ]
        if declared.default is None or declared.default_factory is not None:
            default = "unset"
        else:
            default = f"`{declared.default:g}`" if isinstance(declared.default, float) else f"`{declared.default}`"
        rows.append(f"| `{prefix}{name.upper()}` (`{name}`) | {default} | {', '.join(bounds) or '-'} | {declared.description or ''} |")
    return "\n".join(rows) + "\n"


def _load_setting(table: TableDeclaration, env: Mapping[str, str]) -> str:
    """Where an exported table's load mode was set: its variable, or its declaration."""
    variable = f"{SETTING_PREFIX}{table.name.upper()}_LOAD"
    return variable if env.get(variable) else f"{DECLARATIONS_FILE.name} table {table.name}: load"


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
