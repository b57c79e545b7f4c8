import json
import re

import pytest

from ddb_athena.lib.resources import DEPLOYMENT_FIELDS, SyncSettings, setting_variable, settings_table, sync_settings
from ddb_athena.lib.settings import LOCAL_ENDPOINT_URL, REPO_ROOT, Settings, SettingsError


def test_local_defaults_work_with_nothing_set():
    settings = Settings.from_env({})
    assert settings.profile == "local" and settings.bucket == "ddb-athena-local"
    assert settings.warehouse.startswith("file://") and settings.warehouse.endswith("/.ddb_athena/warehouse")
    assert settings.dynamodb_tables["books"] == "books" and settings.dynamodb_tables["orders"] == "orders" and settings.namespace == "library"
    assert settings.endpoint_url == settings.default_endpoint_url == LOCAL_ENDPOINT_URL
    assert settings.credentials == {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    assert settings.spark_master == "local[2]"
    assert settings.cleanup_interval_seconds == 300


def test_boto3_variables_keep_precedence_over_the_local_default():
    settings = Settings.from_env({"AWS_ENDPOINT_URL": "http://127.0.0.1:9999", "AWS_ACCESS_KEY_ID": "k"})
    assert settings.endpoint_url == "http://127.0.0.1:9999"
    assert settings.default_endpoint_url is None  # boto3 resolves it, and AWS_ENDPOINT_URL_<SERVICE> too
    assert settings.credentials == {}
    assert Settings.from_env({"AWS_ENDPOINT_URL_S3": "http://s3.local"}).s3_endpoint_url == "http://s3.local"


def test_aws_profile():
    settings = Settings.from_env({"DDB_ATHENA_PROFILE": "aws", "DDB_ATHENA_BUCKET": "prod-bucket", "AWS_REGION": "eu-west-1"})
    assert settings.warehouse == "s3://prod-bucket/warehouse"
    assert settings.endpoint_url is None and settings.credentials == {} and settings.spark_master is None
    assert settings.region == "eu-west-1"


@pytest.mark.parametrize(
    "environ",
    [
        {"DDB_ATHENA_PROFILE": "prod"},
        {"DDB_ATHENA_PROFILE": "aws", "DDB_ATHENA_WAREHOUSE": "file:///tmp/x"},
        {"DDB_ATHENA_NAMESPACE": "library; drop"},
        {"DDB_ATHENA_CLEANUP_INTERVAL_SECONDS": "10"},
        {"DDB_ATHENA_CLEANUP_INTERVAL_SECONDS": "5m"},
        {"DDB_ATHENA_SPARK_DRIVER_MEMORY": "1.5g"},
        {"DDB_ATHENA_SPARK_DRIVER_MEMORY": "1536"},
        {"DDB_ATHENA_SPARK_DRIVER_MEMORY": "2g -XX:+Unsafe"},
    ],
)
def test_bad_configuration_is_refused(environ):
    with pytest.raises(ValueError):
        Settings.from_env(environ)


@pytest.mark.parametrize(
    "environ",
    [
        {"DDB_ATHENA_MERGE_INTERVAL_SECONDS": "0"},
        {"DDB_ATHENA_MERGE_INTERVAL_SECONDS": "90"},
        {"DDB_ATHENA_MERGE_INTERVAL_SECONDS": "20s"},
        {"DDB_ATHENA_SYNC_RUN_MINUTES": "-1"},
        {"DDB_ATHENA_SYNC_RUN_MINUTES": "2000"},
        {"DDB_ATHENA_SYNC_RUN_MINUTES": "nan"},
        {"DDB_ATHENA_SYNC_RUN_MINUTES": "an hour"},
        {"DDB_ATHENA_LONGEST_MERGE_INTERVAL_SECONDS": "90"},
        {"DDB_ATHENA_LONGEST_MERGE_INTERVAL_SECONDS": "5"},
        {"DDB_ATHENA_MERGE_INTERVAL_SECONDS": "30", "DDB_ATHENA_LONGEST_MERGE_INTERVAL_SECONDS": "20"},
        {"DDB_ATHENA_PARITY_SETTLE_SECONDS": "60"},  # under two of the longest interval (45 s)
        {"DDB_ATHENA_MERGE_INTERVAL_SECONDS": "60", "DDB_ATHENA_PARITY_SETTLE_SECONDS": "100"},
        {"DDB_ATHENA_BOOKS_CAPTURE": "kinesis"},
        {"DDB_ATHENA_SNAPSHOT_RETENTION_HOURS": "0.5"},
        {"DDB_ATHENA_TOMBSTONE_RETENTION_DAYS": "0"},
        {"DDB_ATHENA_EXPORT_RETENTION_DAYS": "-1"},
    ],
)
def test_a_bad_sync_setting_is_refused_naming_its_variable(environ):
    with pytest.raises(SettingsError, match="|".join(environ)):
        sync_settings(Settings.from_env(environ))


def test_cleanup_interval_comes_from_the_environment():
    assert Settings.from_env({"DDB_ATHENA_CLEANUP_INTERVAL_SECONDS": "60"}).cleanup_interval_seconds == 60


def test_every_sync_setting_comes_from_its_variable_for_the_runs_schedules_and_sensors_start():
    """Not only the run's pace: retention, cadence, parity, exports (before, 13 of them could only be edited in code)."""
    defaults = sync_settings(Settings.from_env({}))
    for name, field in SyncSettings.model_fields.items():
        if name in DEPLOYMENT_FIELDS or name == "books_capture":
            continue
        examples = {
            "capture_failure_queue_urls": {"books": "https://sqs.example/books", "reviews": "https://sqs.example/reviews"},
            "alert_topic_arn": "arn:aws:sns:us-east-1:123456789012:alerts",
            "dagster_url": "https://dagster.example.com",
            "run_capacity": "FARGATE",
            "cleanup_role_arn": "arn:aws:iam::123456789012:role/ddb-athena-DagsterCleanupRole",
        }
        if name in examples:
            value = examples[name]
        else:
            upper = next((rule.le for rule in field.metadata if hasattr(rule, "le")), None)
            value = field.default + 1 if upper is None or field.default + 1 <= upper else (field.default + upper) / 2
        assert getattr(defaults, name) != value, name
        text = json.dumps(value) if isinstance(value, dict) else str(value)
        assert getattr(sync_settings(Settings.from_env({setting_variable(name): text})), name) == value, name
    assert sync_settings(Settings.from_env({"DDB_ATHENA_BOOKS_CAPTURE": "lambda"})).books_capture == "lambda"
    assert sync_settings(Settings.from_env({"DDB_ATHENA_BUCKET": "prod"})).bucket == "prod"
    with pytest.raises(SettingsError, match="DDB_ATHENA_RUN_CAPACITY='spot'"):
        sync_settings(Settings.from_env({"DDB_ATHENA_RUN_CAPACITY": "spot"}))
    with pytest.raises(SettingsError, match="DDB_ATHENA_ALERT_TOPIC_ARN"):
        sync_settings(Settings.from_env({"DDB_ATHENA_ALERT_TOPIC_ARN": "alerts"}))
    with pytest.raises(SettingsError, match='DDB_ATHENA_CAPTURE_FAILURE_QUEUE_URLS=.*expected a JSON object like {"books"'):
        sync_settings(Settings.from_env({"DDB_ATHENA_CAPTURE_FAILURE_QUEUE_URLS": "https://sqs.example/queue"}))


def test_the_longest_interval_is_never_shorter_than_a_longer_merge_interval_left_unset():
    assert sync_settings(Settings.from_env({})).longest_merge_interval_seconds == 45.0
    assert sync_settings(Settings.from_env({"DDB_ATHENA_MERGE_INTERVAL_SECONDS": "50"})).longest_merge_interval_seconds == 50.0
    given = {"DDB_ATHENA_MERGE_INTERVAL_SECONDS": "10", "DDB_ATHENA_LONGEST_MERGE_INTERVAL_SECONDS": "15"}
    assert sync_settings(Settings.from_env(given)).longest_merge_interval_seconds == 15.0


def test_a_parity_settle_of_twice_the_longest_interval_is_taken():
    given = {"DDB_ATHENA_MERGE_INTERVAL_SECONDS": "60", "DDB_ATHENA_PARITY_SETTLE_SECONDS": "120"}
    assert sync_settings(Settings.from_env(given)).parity_settle_seconds == 120.0


def test_the_settings_table_in_the_docs_is_the_declared_one():
    """docs/operations.md shows `ddb-athena settings` (the deployment's, each exported table's, the sync resource's):
    regenerate them there when a field changes."""
    docs = (REPO_ROOT / "docs" / "operations.md").read_text()
    tables = settings_table().split("\n\n")
    assert len(tables) == 3 and all(table.strip() in docs for table in tables)


@pytest.mark.parametrize(
    "resource_field, run_config_field, value",
    [
        ("sync_run_minutes", "run_minutes", -1),
        ("sync_run_minutes", "run_minutes", 1441),
        ("merge_interval_seconds", "merge_interval_seconds", 0.5),
        ("merge_interval_seconds", "merge_interval_seconds", 61),
    ],
)
def test_a_run_length_or_merge_interval_out_of_range_is_refused_in_the_resource_and_in_run_config(resource_field, run_config_field, value):
    """The same bounds as the environment variables, however the run's length or interval is set."""
    from ddb_athena.streamed.assets import SyncConfig

    with pytest.raises(ValueError):
        SyncSettings(bucket="b", **{resource_field: value})
    with pytest.raises(ValueError):
        SyncConfig(**{run_config_field: value})


def test_settings_error_is_a_value_error():
    assert issubclass(SettingsError, ValueError)


def test_clients_use_the_endpoints_of_the_environment_the_settings_were_read_from():
    settings = Settings.from_env(
        {"AWS_ENDPOINT_URL": "http://127.0.0.1:7001", "AWS_ENDPOINT_URL_DYNAMODB_STREAMS": "http://127.0.0.1:7002", "AWS_ACCESS_KEY_ID": "k"}
    )
    assert settings.client("s3").meta.endpoint_url == "http://127.0.0.1:7001"
    assert settings.client("dynamodbstreams").meta.endpoint_url == "http://127.0.0.1:7002"
    assert Settings.from_env({}).client("dynamodb").meta.endpoint_url == LOCAL_ENDPOINT_URL


EMR_STACK_OUTPUTS = {
    "DDB_ATHENA_EMR_APPLICATION_ID": "00fabcdefghij000",
    "DDB_ATHENA_EMR_EXECUTION_ROLE_ARN": "arn:aws:iam::123456789012:role/ddb-athena-SparkJobRole",
    "DDB_ATHENA_EMR_CODE_URI": "s3://code-bucket/ddb_athena/emr",
    "DDB_ATHENA_EMR_LOG_GROUP": "/ddb_athena/ddb-athena/spark",
}
AWS = {"DDB_ATHENA_PROFILE": "aws", "DDB_ATHENA_BUCKET": "prod"}


def test_the_orders_load_runs_in_process_unless_told_otherwise():
    from ddb_athena.resources import resources_from_settings

    assert resources_from_settings(Settings.from_env({}))["orders_load"].mode_of("orders") == "in_process"
    runner = resources_from_settings(Settings.from_env({**AWS, "DDB_ATHENA_ORDERS_LOAD": "emr_serverless", **EMR_STACK_OUTPUTS}))["orders_load"]
    assert runner.mode_of("orders") == "emr_serverless" and runner.emr_job().code("x.py") == "s3://code-bucket/ddb_athena/emr/x.py"
    assert runner.emr_release_label == "emr-7.12.0" and runner.emr_timeout_minutes == 180


@pytest.mark.parametrize(
    "environ, named",
    [
        ({"DDB_ATHENA_ORDERS_LOAD": "lambda"}, "DDB_ATHENA_ORDERS_LOAD='lambda': Input should be 'in_process', 'spark_submit' or 'emr_serverless'"),
        ({"DDB_ATHENA_ORDERS_LOAD": "emr_serverless", **EMR_STACK_OUTPUTS}, "needs DDB_ATHENA_PROFILE=aws"),
        ({**AWS, "DDB_ATHENA_ORDERS_LOAD": "emr_serverless"}, "DDB_ATHENA_EMR_APPLICATION_ID, DDB_ATHENA_EMR_EXECUTION_ROLE_ARN"),
        ({**AWS, "DDB_ATHENA_ORDERS_LOAD": "emr_serverless", **EMR_STACK_OUTPUTS, "DDB_ATHENA_EMR_LOG_GROUP": ""}, "DDB_ATHENA_EMR_LOG_GROUP"),
    ],
)
def test_an_orders_load_that_cannot_run_is_refused_with_what_is_missing(environ, named):
    with pytest.raises(SettingsError, match=named):
        Settings.from_env(environ)


def test_an_exported_table_declared_to_load_on_emr_is_refused_where_emr_cannot_run(monkeypatch):
    """The declaration's load is checked as its variable is, and the error names where it was set."""
    from ddb_athena.lib import declarations

    text = (REPO_ROOT / "ddb_athena" / "tables.toml").read_text().replace("freshness_minutes = 1560", 'freshness_minutes = 1560\nload = "emr_serverless"')
    monkeypatch.setattr(declarations, "declared_tables", lambda: declarations.parse_declarations(text))
    monkeypatch.setattr("ddb_athena.lib.settings.declared_tables", declarations.declared_tables)
    with pytest.raises(SettingsError, match="tables.toml table orders: load=emr_serverless needs DDB_ATHENA_PROFILE=aws"):
        Settings.from_env({})
    with pytest.raises(SettingsError, match="tables.toml table orders: load=emr_serverless needs DDB_ATHENA_EMR_APPLICATION_ID"):
        Settings.from_env(AWS)
    assert Settings.from_env({**AWS, **EMR_STACK_OUTPUTS}).exported["orders"].load == "emr_serverless"
    assert Settings.from_env({"DDB_ATHENA_ORDERS_LOAD": "in_process"}).exported["orders"].load == "in_process"


def test_a_malformed_emr_setting_fails_when_the_code_location_loads():
    from ddb_athena.lake.job_submission import JobSubmissionError
    from ddb_athena.resources import resources_from_settings

    environ = {**AWS, "DDB_ATHENA_ORDERS_LOAD": "emr_serverless", **EMR_STACK_OUTPUTS, "DDB_ATHENA_EMR_CODE_URI": "/home/me/emr"}
    with pytest.raises(JobSubmissionError, match="code location '/home/me/emr'"):
        resources_from_settings(Settings.from_env(environ))


def test_deletes_are_remembered_at_least_as_long_as_the_stream_keeps_changes():
    import pydantic

    from ddb_athena.lib.resources import SyncSettings

    with pytest.raises(pydantic.ValidationError, match="tombstone_retention_days"):
        SyncSettings(bucket="b", tombstone_retention_days=0.5)
    assert SyncSettings(bucket="b", tombstone_retention_days=1).tombstone_retention_days == 1


def test_the_spark_drivers_heap_is_the_deployments_choice_and_sparks_own_default_when_unset():
    from ddb_athena.resources import resources_from_settings

    unset = resources_from_settings(Settings.from_env({}))["spark"].spark_config()
    assert "spark.driver.memory" not in unset
    chosen = resources_from_settings(Settings.from_env({"DDB_ATHENA_SPARK_DRIVER_MEMORY": "1536m"}))["spark"].spark_config()
    assert chosen["spark.driver.memory"] == "1536m"


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"bucket": "another-bucket"}, "bucket 'another-bucket' (the deployment's: 'test-bucket')"),
        ({"dynamodb_tables": {"books": "prod-books"}}, "the DynamoDB table of books 'prod-books' (the deployment's: 'books')"),
        ({"dynamodb_tables": {"reviews": "other-reviews"}}, "the DynamoDB table of reviews 'other-reviews' (the deployment's: 'reviews')"),
        ({"namespace": "elsewhere"}, "namespace 'elsewhere'"),
        ({"namespace": None}, "namespace 'library'"),  # left out: the field's default, not the deployment's
    ],
)
def test_a_run_cannot_point_its_settings_at_another_table_than_its_leases_fence(settings, override, named):
    """A launchpad run may change any setting of the `sync` resource but where the tables are: its leases are keyed by
    the bucket and the Iceberg table, so another bucket, namespace or DynamoDB table would make it a second writer."""
    from dagster import DagsterInstance, job, op

    from ddb_athena_tests.dagster_helpers import local_resources

    touched = []

    @op
    def writes(sync: SyncSettings):
        touched.append(sync.bucket)

    @job(resource_defs=local_resources())
    def a_run():
        writes()

    # A run config of the resource replaces the code location's values (Dagster falls back to the fields' defaults, not
    # to them): it names where the tables are, or is refused.
    required = {"bucket": settings.bucket, "dynamodb_tables": dict(settings.dynamodb_tables), "namespace": settings.namespace}
    with DagsterInstance.ephemeral() as instance:
        config = {name: value for name, value in (required | override).items() if value is not None}
        result = a_run.execute_in_process(run_config={"resources": {"sync": {"config": config}}}, instance=instance, raise_on_error=False)
        assert not result.success and touched == []
        failure = next(event for event in result.all_events if event.is_failure)
        message = str(failure.event_specific_data.error.cause or failure.event_specific_data.error)
        assert named in message and "A run cannot move a table" in message, message
        # Any other setting is the run's to change.
        assert a_run.execute_in_process(run_config={"resources": {"sync": {"config": required | {"merge_interval_seconds": 5}}}}, instance=instance).success


def test_the_data_stacks_settings_parameter_supplies_its_choices_under_the_processs_own_variables(aws_env, settings):
    from ddb_athena.lib.settings import STACK_SETTINGS_VARIABLE, _stack_settings

    ssm, name = settings.client("ssm"), "/ddb_athena/ddb-athena/settings"
    queues = {"books": "https://sqs.us-east-1.amazonaws.com/123456789012/books-failures"}
    stack = {"DDB_ATHENA_BOOKS_CAPTURE": "lambda", "DDB_ATHENA_CAPTURE_FAILURE_QUEUE_URLS": queues, "DDB_ATHENA_ORDERS_LOAD": "in_process"}
    ssm.put_parameter(Name=name, Type="String", Value=json.dumps(stack))
    environment = {**aws_env_variables(), STACK_SETTINGS_VARIABLE: name}
    _stack_settings.cache_clear()
    sync = sync_settings(Settings.from_env(environment))
    assert sync.books_capture == "lambda" and sync.capture_failure_queue_urls == queues
    # A process's own variable wins (one deployment's override), and a process reads the parameter once.
    assert sync_settings(Settings.from_env({**environment, "DDB_ATHENA_BOOKS_CAPTURE": "run"})).books_capture == "run"
    ssm.put_parameter(Name=name, Type="String", Value=json.dumps({**stack, "DDB_ATHENA_BOOKS_CAPTURE": "run"}), Overwrite=True)
    assert sync_settings(Settings.from_env(environment)).books_capture == "lambda"
    _stack_settings.cache_clear()  # a new process
    assert sync_settings(Settings.from_env(environment)).books_capture == "run"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (None, "could not be read"),
        ("[1, 2]", "not a JSON object"),
        ('{"AWS_SECRET_ACCESS_KEY": "x"}', "holds AWS_SECRET_ACCESS_KEY; only DDB_ATHENA_* settings"),
    ],
)
def test_a_missing_or_foreign_stack_settings_parameter_is_refused_naming_it(aws_env, settings, value, problem):
    from ddb_athena.lib.settings import STACK_SETTINGS_VARIABLE, _stack_settings

    name = "/ddb_athena/ddb-athena/settings"  # the deployment's own name: the runs' role may read it (test_iam_coverage)
    if value is not None:
        settings.client("ssm").put_parameter(Name=name, Type="String", Value=value)
    _stack_settings.cache_clear()
    with pytest.raises(SettingsError, match=f"{STACK_SETTINGS_VARIABLE}='{name}': .*{re.escape(problem)}"):
        Settings.from_env({**aws_env_variables(), STACK_SETTINGS_VARIABLE: name})


def aws_env_variables() -> dict[str, str]:
    import os

    return {name: value for name, value in os.environ.items() if name.startswith(("AWS_", "DDB_ATHENA_"))}


def test_a_table_of_a_longer_interval_has_a_backlog_limit_of_two_of_its_intervals():
    from dataclasses import replace
    from datetime import timedelta

    from ddb_athena.lib.declarations import declared

    sync = sync_settings(Settings.from_env({}))
    reviews = declared("reviews")
    assert sync.backlog_limit_of(reviews) == timedelta(minutes=2)
    assert sync.backlog_limit_of(replace(reviews, merge_interval_seconds=150.0)) == timedelta(seconds=300)
