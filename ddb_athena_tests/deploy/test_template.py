"""deploy/ddb_athena.yaml: lint-clean, private and encrypted, nothing expires the warehouse, least privilege
in its shape (no `*` action, `*` resources only where IAM has no resource scoping), the capture mapping as
the handler expects it, and a deployment into the emulator of every resource type moto can create."""

import json
import os
import re
import time
from pathlib import Path

import pytest
from cfnlint.api import ManualArgs, lint_file

from ddb_athena.lib.declarations import declared_tables, parse_declarations
from ddb_athena.lib.resources import sync_settings
from ddb_athena.lib.settings import STACK_SETTINGS_VARIABLE, Settings, _stack_settings
from ddb_athena_build.packaging import CAPTURE_LAMBDA, build_zip
from ddb_athena_build.templates import LOG_RETENTION_DAYS, camel, deployed_instance
from ddb_athena_tests.deploy.policies import TEMPLATE, as_list, load_template, rendered, table_parameters
from ddb_athena_tests.deploy.policies import load_template as template

# IAM actions without resource-level permissions: `Resource: "*"` is the only form they take.
UNSCOPABLE_ACTIONS = {"dynamodb:ListStreams"}
# What moto's CloudFormation cannot create (PLATFORM.md): left out of the emulator deployment. (With
# EnableEmrServerless off, its roles and log group are not created either: the static tests cover them.)
NOT_EMULATED = {"AWS::Glue::Database", "AWS::S3::BucketPolicy", "AWS::EMRServerless::Application", "AWS::CloudTrail::Trail"}


def warehouse_prefix() -> str:
    warehouse = Settings.from_env({"DDB_ATHENA_PROFILE": "aws", "DDB_ATHENA_BUCKET": "b"}).warehouse
    return warehouse.removeprefix("s3://b/") + "/"


def rules_deleting_under(prefix: str, rules: list[dict]) -> list[str]:
    """Lifecycle rules that could delete or move a live object under `prefix` (aborting uploads never does)."""
    found = []
    for rule in rules:
        scope = rule.get("Prefix", rule.get("Filter", {}).get("Prefix", rule.get("Filter", {}).get("And", {}).get("Prefix", "")))
        overlaps = prefix.startswith(scope) or scope.startswith(prefix)
        # Aborting uploads, and removing versions no longer current (and delete markers with none behind them), never
        # touch a live object: what a query plans on is always a current version.
        actions = set(rule) - {"Id", "Status", "Prefix", "Filter", "AbortIncompleteMultipartUpload", "NoncurrentVersionExpiration", "ExpiredObjectDeleteMarker"}
        if overlaps and actions:
            found.append(rule["Id"])
    return found


def policy_statements(resources: dict):
    for name, resource in resources.items():
        properties = resource.get("Properties", {})
        documents = [policy["PolicyDocument"] for policy in properties.get("Policies", [])]
        if resource["Type"] in ("AWS::IAM::ManagedPolicy", "AWS::IAM::Policy"):
            documents.append(properties["PolicyDocument"])
        for document in documents:
            for statement in document["Statement"]:
                # A statement under a condition: either branch that is one.
                branches = statement["Fn::If"][1:] if set(statement) == {"Fn::If"} else [statement]
                yield from ((name, branch) for branch in branches if branch != {"Ref": "AWS::NoValue"})


def test_cfn_lint_finds_nothing_not_even_informational():
    assert lint_file(TEMPLATE, config=ManualArgs(include_checks=["I"])) == []


def test_no_lifecycle_rule_can_delete_a_warehouse_file():
    rules = template()["Resources"]["DataBucket"]["Properties"]["LifecycleConfiguration"]["Rules"]
    assert warehouse_prefix() == "warehouse/"
    assert rules_deleting_under(warehouse_prefix(), rules) == []
    # The check itself: a bucket-wide expiry, or one on the warehouse, is caught.
    assert rules_deleting_under("warehouse/", [{"Id": "all", "Prefix": "", "ExpirationInDays": 30}]) == ["all"]
    assert rules_deleting_under("warehouse/", [{"Id": "wh", "Filter": {"Prefix": "warehouse/data/"}, "Transitions": []}]) == ["wh"]
    # The sources' leftovers do expire, and so do the runs' compute logs (deploy/dagster.yaml's prefix), after as long as
    # the containers' logs are kept in CloudWatch.
    expiring = {f"{t.source_prefix}/quarantine/" if t.kind == "streamed" else f"{t.source_prefix}/" for t in declared_tables().values()}
    compute_logs = deployed_instance()["compute_logs"]["config"]["prefix"] + "/"
    assert {rule["Prefix"] for rule in rules if "ExpirationInDays" in rule} == expiring | {compute_logs}
    assert {"books_source/quarantine/", "orders_export/"} <= expiring
    (rule,) = [rule for rule in rules if rule["Prefix"] == compute_logs]
    platform_logs = load_template(rendered("dagster_ecs.yaml"))["Resources"]["LogGroup"]["Properties"]["RetentionInDays"]
    assert rule["ExpirationInDays"] == platform_logs == LOG_RETENTION_DAYS


def test_the_bucket_is_encrypted_private_and_tls_only():
    resources = template()["Resources"]
    bucket = resources["DataBucket"]["Properties"]
    assert bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"]["SSEAlgorithm"]
    assert all(bucket["PublicAccessBlockConfiguration"].values()) and len(bucket["PublicAccessBlockConfiguration"]) == 4
    deny = resources["DataBucketPolicy"]["Properties"]["PolicyDocument"]["Statement"][0]
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_policies_name_their_actions_and_scope_their_resources():
    statements = list(policy_statements(template()["Resources"]))
    assert {name for name, _ in statements} == {
        "CaptureFunctionRole",
        "DagsterRunRole",
        "DagsterEmrServerlessPolicy",
        "DagsterStreamCapturePolicy",
        "DagsterCaptureFailuresPolicy",
        "DagsterCleanupRole",
        "SparkJobRole",
    }
    assert_named_and_scoped(statements, UNSCOPABLE_ACTIONS)


def assert_named_and_scoped(statements: list[tuple[str, dict]], unscopable: set[str]) -> None:
    """Allow statements only, no `*` in an action, `*` as a resource only for actions IAM cannot scope."""
    for name, statement in statements:
        actions = as_list(statement["Action"])
        assert statement["Effect"] == "Allow" and "NotAction" not in statement and "NotResource" not in statement
        assert not any("*" in action for action in actions), (name, actions)
        if "*" in as_list(statement["Resource"]):
            assert set(actions) <= unscopable, (name, actions)


def test_the_capture_mapping_retries_boundedly_and_never_blocks_a_shard():
    resources = template()["Resources"]
    function = resources["CaptureFunction"]["Properties"]
    assert f"{function['Handler']}" == f"{CAPTURE_LAMBDA.module}.handler" and function["Runtime"] == "python3.12"
    mappings = {r["Properties"]["EventSourceArn"]["Ref"]: r["Properties"] for r in resources.values() if r["Type"] == "AWS::Lambda::EventSourceMapping"}
    # One mapping a streamed table, on its stream.
    assert set(mappings) == {f"{camel(table.name)}StreamArn" for table in declared_tables().values() if table.kind == "streamed"}
    for stream, mapping in mappings.items():
        assert mapping["FunctionName"] == {"Ref": "CaptureFunction"}
        assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]  # the handler's batchItemFailures
        assert mapping["BisectBatchOnFunctionError"] is True
        assert 0 < mapping["MaximumRetryAttempts"] <= 10
        assert 0 < mapping["MaximumRecordAgeInSeconds"] < 24 * 3600  # replayable: inside the stream's retention
        # Each table's failed batches in its own queue: they turn only its check red.
        queue = stream.replace("StreamArn", "FailureQueue")
        assert mapping["DestinationConfig"]["OnFailure"]["Destination"] == {"Fn::GetAtt": [f"Capture{queue}", "Arn"]}
        assert mapping["StartingPosition"] == "TRIM_HORIZON" and mapping["ParallelizationFactor"] == 1


def emulated(body: dict) -> dict:
    """The template without what moto cannot create, nor what refers to it."""
    left_out = {name for name, resource in body["Resources"].items() if resource["Type"] in NOT_EMULATED}
    body["Resources"] = {name: resource for name, resource in body["Resources"].items() if name not in left_out}
    body["Outputs"] = {name: output for name, output in body["Outputs"].items() if not set(json.dumps(output).split('"')) & left_out}
    return body


def created_stack(cloudformation, name: str, body: dict, parameters: dict) -> dict:
    """The stack `body` created in the emulator with `parameters`, once complete: its description."""
    cloudformation.create_stack(
        StackName=name,
        TemplateBody=json.dumps(body),
        Parameters=[{"ParameterKey": key, "ParameterValue": value} for key, value in parameters.items()],
        Capabilities=["CAPABILITY_IAM"],
    )
    deadline = time.monotonic() + 120
    while (stack := cloudformation.describe_stacks(StackName=name)["Stacks"][0])["StackStatus"].endswith("IN_PROGRESS"):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert stack["StackStatus"] == "CREATE_COMPLETE", stack.get("StackStatusReason")
    return stack


def stack_table_parameters(settings) -> dict:
    """The stack's parameters for the declared tables, as the emulator has them."""
    dynamodb = settings.client("dynamodb")
    return table_parameters(settings.dynamodb_tables, lambda name: dynamodb.describe_table(TableName=name)["Table"]["LatestStreamArn"])


def data_stack(settings, tmp_path, **parameters) -> dict:
    """deploy/ddb_athena.yaml in the emulator for the test's tables (the capture Lambda's zip uploaded first), with
    `parameters` beside theirs."""
    s3 = settings.client("s3")
    archive = tmp_path / "capture-lambda.zip"
    build_zip(archive)
    s3.create_bucket(Bucket="code-bucket")
    s3.upload_file(str(archive), "code-bucket", "ddb_athena/streamed/capture-lambda.zip")
    parameters |= stack_table_parameters(settings) | {"CaptureCodeBucket": "code-bucket", "AlertEmail": "oncall@example.com"}
    return created_stack(settings.client("cloudformation"), "ddb-athena", emulated(template()), parameters)


@pytest.mark.subprocess
@pytest.mark.parametrize("principal, books_capture", [("ecs-task", "lambda"), ("ec2-instance", "run")])
def test_the_stack_deploys_into_the_emulator(settings, tmp_path, principal, books_capture):
    s3 = settings.client("s3")
    stack = data_stack(settings, tmp_path, DagsterPrincipal=principal, BooksCapture=books_capture)
    stream_arn = settings.client("dynamodb").describe_table(TableName=settings.dynamodb_tables["books"])["Table"]["LatestStreamArn"]
    outputs = {output["OutputKey"]: output["OutputValue"] for output in stack["Outputs"]}
    bucket = outputs["BucketName"]
    # moto's CloudFormation creates the bucket but applies neither its public access block, its lifecycle rules nor
    # its versioning (moto 5.2.5): the template tests check those.
    assert s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
    lambda_client = settings.client("lambda")
    if books_capture == "lambda":
        function = lambda_client.get_function(FunctionName=outputs["CaptureFunctionName"])["Configuration"]
        assert function["Environment"]["Variables"]["DDB_ATHENA_BUCKET"] == bucket
        mappings = lambda_client.list_event_source_mappings(FunctionName=outputs["CaptureFunctionName"])["EventSourceMappings"]
        streams = {value for name, value in stack_table_parameters(settings).items() if name.endswith("StreamArn")}
        assert sorted(mapping["EventSourceArn"] for mapping in mappings) == sorted(streams) and stream_arn in streams
    else:  # the sync run reads the stream: no Lambda, and its role may read the stream
        assert lambda_client.list_functions()["Functions"] == [] and "CaptureFunctionName" not in outputs
    role = settings.client("iam").get_role(RoleName=outputs["DagsterRunRoleArn"].rsplit("/", 1)[1])["Role"]
    trusted = role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]["Service"]
    assert trusted == {"ecs-task": "ecs-tasks.amazonaws.com", "ec2-instance": "ec2.amazonaws.com"}[principal]
    assert ("DagsterInstanceProfileArn" in outputs) == (principal == "ec2-instance")
    assert outputs["AlertTopicArn"] in [topic["TopicArn"] for topic in settings.client("sns").list_topics()["Topics"]]
    # The stack's choices reach the code through its parameter: the sync resource of a process that names it.
    stack_settings = json.loads(settings.client("ssm").get_parameter(Name=outputs["StackSettingsParameterName"])["Parameter"]["Value"])
    # OrdersLoad left empty: orders loads as its declaration says.
    assert stack_settings["DDB_ATHENA_BOOKS_CAPTURE"] == books_capture and stack_settings["DDB_ATHENA_ORDERS_LOAD"] == ""
    _stack_settings.cache_clear()
    sync = sync_settings(Settings.from_env({**os.environ, STACK_SETTINGS_VARIABLE: outputs["StackSettingsParameterName"]}))
    assert sync.books_capture == books_capture
    if books_capture == "lambda":
        queues = json.loads(outputs["CaptureFailureQueueUrls"])
        assert sync.capture_failure_queue_urls == queues and set(queues) == {name for name, table in declared_tables().items() if table.kind == "streamed"}
    else:
        assert sync.capture_failure_queue_urls == {}


def test_the_capture_alarms_on_its_errors_its_lag_and_its_failed_batches_to_the_alert_topic():
    resources = template()["Resources"]
    every = [resource for resource in resources.values() if resource["Type"] == "AWS::CloudWatch::Alarm" and resource.get("Condition") == "WithCaptureLambda"]
    alarms = {resource["Properties"]["MetricName"]: resource for resource in every}
    assert set(alarms) == {"Errors", "IteratorAge", "ApproximateNumberOfMessagesVisible"}
    assert all(alarm["Condition"] == "WithCaptureLambda" and alarm["Properties"]["Threshold"] >= 0 for alarm in alarms.values())
    # Every alarm tells the one topic the alert sensors publish to.
    assert all(alarm["Properties"]["AlarmActions"] == [{"Ref": "AlertTopic"}] for alarm in alarms.values())
    assert alarms["IteratorAge"]["Properties"]["Threshold"] <= 120_000  # milliseconds: the freshness promise
    # One depth alarm a streamed table's failure queue.
    queues = [alarm["Properties"]["Dimensions"][0]["Value"] for alarm in every if alarm["Properties"]["MetricName"] == "ApproximateNumberOfMessagesVisible"]
    streamed = [table for table in declared_tables().values() if table.kind == "streamed"]
    assert queues == [{"Fn::GetAtt": [f"Capture{camel(table.name)}FailureQueue", "QueueName"]} for table in streamed]


def test_alerts_reach_someone_and_an_alert_not_delivered_is_one():
    """Issue 69: the alert topic has a subscriber from the first deploy (AlertEmail is required), and SNS failing to
    deliver to one of them alarms to the topic (the others hear of it); the database's events may publish there."""
    from ddb_athena_bench.bill import ALERT_DELIVERY_ALARMS

    body = template()
    assert "Default" not in body["Parameters"]["AlertEmail"] and "Condition" not in body["Resources"]["AlertEmailSubscription"]
    assert body["Resources"]["AlertEmailSubscription"]["Properties"]["Endpoint"] == {"Ref": "AlertEmail"}
    unconditional = [resource for resource in body["Resources"].values() if resource["Type"] == "AWS::CloudWatch::Alarm" and "Condition" not in resource]
    (delivery,) = unconditional
    assert len(unconditional) == ALERT_DELIVERY_ALARMS  # as many as the bill prices
    properties = delivery["Properties"]
    assert (properties["Namespace"], properties["MetricName"]) == ("AWS/SNS", "NumberOfNotificationsFailed")
    assert properties["AlarmActions"] == [{"Ref": "AlertTopic"}]
    assert properties["Dimensions"] == [{"Name": "TopicName", "Value": {"Fn::GetAtt": ["AlertTopic", "TopicName"]}}]


# A third table, named by a variable, with a composite key: what a user's declaration adds to the deployment.
THIRD_TABLE = """
[ledger_entries]
kind = "streamed"
dynamodb_table = "ledger"
dynamodb_table_variable = "DDB_ATHENA_LEDGER_TABLE"
iceberg_table = "ledger_entries"
partition_key = { attribute = "account", type = "S" }
sort_key = { attribute = "entry", type = "N" }
freshness_minutes = 5

[audits]
kind = "exported"
dynamodb_table = "audits"
iceberg_table = "audits"
partition_key = { attribute = "audit_id", type = "S" }
columns = [{ name = "at", attribute = "at", transform = "iso_timestamp", required = true }]
partition_by = ["days(at)"]
freshness_minutes = 1560
"""


@pytest.mark.parametrize("extra", ["", THIRD_TABLE], ids=["declared", "with-two-more"])
def test_the_rendered_grants_follow_the_declared_tables_and_name_no_other(extra):
    """Every declared table has its DynamoDB table (its parameter where a variable names it), its stream and its S3
    prefix granted, and every prefix the template names belongs to a declared table (besides the platform's own: the
    warehouse, the writer leases, Dagster's logs). Lint-clean for any set of tables."""
    tables = [*declared_tables().values(), *(parse_declarations(extra).values() if extra else [])]
    path = rendered("ddb_athena.yaml", tables)
    assert lint_file(path, config=ManualArgs(include_checks=["I"])) == []
    text = path.read_text()
    named = set(re.findall(r"\$\{Bucket\}/([A-Za-z0-9_-]+)/", text)) | set(re.findall(r"Prefix: ([A-Za-z0-9_]+)/", text))
    named |= {prefix for listed in re.findall(r"s3:prefix: \[([^]]*)\]", text) for prefix in re.findall(r"(?:^|, )([A-Za-z0-9_-]+)/", listed)}
    assert named - {"warehouse", "_writer_leases", "dagster"} == {table.source_prefix for table in tables}
    body = load_template(path)
    parameters, mappings = body["Parameters"], [r["Properties"] for r in body["Resources"].values() if r["Type"] == "AWS::Lambda::EventSourceMapping"]
    for table in tables:
        arn = f"table/${{{camel(table.name)}TableName}}" if table.dynamodb_table_variable else f"table/{table.dynamodb_table}"
        assert f':{arn}"' in text, f"{table.name}: its DynamoDB table is not granted"
        assert (f"{camel(table.name)}TableName" in parameters) == bool(table.dynamodb_table_variable)
        stream = f"{camel(table.name)}StreamArn"
        assert (stream in parameters) == (table.kind == "streamed") == ({"Ref": stream} in [m["EventSourceArn"] for m in mappings])
    lambda_variables = body["Resources"]["CaptureFunction"]["Properties"]["Environment"]["Variables"]
    streamed_variables = {t.dynamodb_table_variable for t in tables if t.kind == "streamed" and t.dynamodb_table_variable}
    assert {name for name in lambda_variables if name.endswith("_TABLE")} == streamed_variables
    platform = rendered("dagster_ecs.yaml", tables).read_text()
    assert all(f"{t.dynamodb_table_variable}, Value" in platform for t in tables if t.dynamodb_table_variable)


PER_TABLE_CHOICES = """
[ledger]
kind = "streamed"
dynamodb_table = "ledger"
iceberg_table = "ledger"
partition_key = { attribute = "entry_id", type = "S" }
freshness_minutes = 2
capture = "lambda"

[cache]
kind = "streamed"
dynamodb_table = "cache"
iceberg_table = "cache"
partition_key = { attribute = "key", type = "S" }
freshness_minutes = 2
capture = "run"

[archive]
kind = "exported"
dynamodb_table = "archive"
iceberg_table = "archive"
partition_key = { attribute = "archive_id", type = "S" }
columns = [{ name = "at", attribute = "at", transform = "iso_timestamp", required = true }]
partition_by = ["days(at)"]
freshness_minutes = 1560
load = "emr_serverless"
"""


def test_a_tables_declared_capture_and_load_are_the_stacks():
    """Issue 68: a table declaring capture = "run" never gets a stream mapping (the sync run reads its stream whatever
    BooksCapture says); one declaring "lambda" gets one, and the stack refuses BooksCapture=run (no Lambda would read
    it); the others follow BooksCapture. A table declaring load = "emr_serverless" needs the EMR application."""
    tables = [*declared_tables().values(), *parse_declarations(PER_TABLE_CHOICES).values()]
    path = rendered("ddb_athena.yaml", tables)
    assert lint_file(path, config=ManualArgs(include_checks=["I"])) == []
    body = load_template(path)
    mappings = {name: resource["Condition"] for name, resource in body["Resources"].items() if resource["Type"] == "AWS::Lambda::EventSourceMapping"}
    assert mappings == {f"Capture{name}Stream": "WithCaptureLambda" for name in ("Books", "Reviews", "Ledger")}
    rules = body["Rules"]
    (lambda_needed,) = rules["DeclaredLambdaCaptureNeedsTheLambda"]["Assertions"]
    assert lambda_needed["Assert"] == {"Fn::Equals": [{"Ref": "BooksCapture"}, "lambda"]} and "ledger" in lambda_needed["AssertDescription"]
    (emr_needed,) = rules["DeclaredEmrLoadsNeedTheApplication"]["Assertions"]
    assert emr_needed["Assert"] == {"Fn::Equals": [{"Ref": "EnableEmrServerless"}, "true"]} and "archive" in emr_needed["AssertDescription"]
    # As declared in this repository, nothing per table: BooksCapture and OrdersLoad decide, and no rule asks more.
    assert set(load_template()["Rules"]) == {"EmrLoadNeedsTheApplication"}


def test_the_warehouse_has_a_recovery_point_no_role_can_delete():
    """Issue 69: the bucket is versioned; versions no longer current go after WarehouseRecoveryDays (never a live
    object); no principal but the break-glass role may delete a version, the runs' and the Spark job's roles
    included; every write and delete in the bucket is logged (CloudTrail write-only data events)."""
    body = template()
    parameters, resources = body["Parameters"], body["Resources"]
    bucket = resources["DataBucket"]["Properties"]
    assert bucket["VersioningConfiguration"] == {"Status": "Enabled"}
    (noncurrent,) = [rule for rule in bucket["LifecycleConfiguration"]["Rules"] if "NoncurrentVersionExpiration" in rule]
    assert noncurrent["NoncurrentVersionExpiration"] == {"NoncurrentDays": {"Ref": "WarehouseRecoveryDays"}} and noncurrent["Prefix"] == ""
    assert set(noncurrent) <= {"Id", "Status", "Prefix", "NoncurrentVersionExpiration", "ExpiredObjectDeleteMarker"}  # no live object
    assert parameters["WarehouseRecoveryDays"]["Default"] >= 1
    statements = {statement["Sid"]: statement for statement in resources["DataBucketPolicy"]["Properties"]["PolicyDocument"]["Statement"]}
    deny = statements["NoVersionDeletes"]
    assert (deny["Effect"], deny["Principal"], deny["Action"]) == ("Deny", "*", "s3:DeleteObjectVersion")
    but_break_glass = {"ArnNotEquals": {"aws:PrincipalArn": {"Ref": "BreakGlassRoleArn"}}}
    assert deny["Condition"] == {"Fn::If": ["WithBreakGlassRole", but_break_glass, {"Ref": "AWS::NoValue"}]}
    trail = resources["DataEventsTrail"]["Properties"]
    (selector,) = trail["EventSelectors"]
    assert selector["ReadWriteType"] == "WriteOnly" and selector["DataResources"][0]["Type"] == "AWS::S3::Object"
    assert trail["IsLogging"] and trail["EnableLogFileValidation"] and trail["S3BucketName"] == {"Ref": "AuditLogBucket"}
    assert resources["AuditLogBucket"]["Properties"]["VersioningConfiguration"] == {"Status": "Enabled"}


# CloudFormation's quotas (docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/cloudformation-limits.html): a
# template body passed inline at most 51,200 bytes, one from S3 at most 1 MB; 500 resources, 200 parameters.
INLINE_TEMPLATE_BYTES, S3_TEMPLATE_BYTES, MAX_RESOURCES, MAX_PARAMETERS = 51_200, 1_000_000, 500, 200


def test_fifty_declared_tables_render_stacks_within_cloudformations_quotas_and_the_runbook_deploys_them_from_s3():
    """25 streamed and 25 exported tables (issue 68): both stacks lint clean and fit CloudFormation's quotas. The data
    stack of three tables is already near the inline limit (a fourth or fifth table passes it), so the documented
    deploy commands upload the templates to S3 (`--s3-bucket`), whatever the number of tables."""
    from ddb_athena_bench.many_declarations import declarations_text

    tables = list(parse_declarations(declarations_text(25, 25)).values())
    for name in ("ddb_athena.yaml", "dagster_ecs.yaml"):
        path = rendered(name, tables)
        assert lint_file(path, config=ManualArgs(include_checks=["I"])) == [], name
        body = load_template(path)
        assert len(path.read_bytes()) <= S3_TEMPLATE_BYTES and len(body["Resources"]) <= MAX_RESOURCES and len(body.get("Parameters", {})) <= MAX_PARAMETERS
    assert len(rendered("ddb_athena.yaml", tables).read_bytes()) > INLINE_TEMPLATE_BYTES
    for document in ("README.md", "docs/operations.md"):
        text = (Path(__file__).resolve().parents[2] / document).read_text()
        deploys = re.findall(r"aws cloudformation deploy (?:[^\n]*\\\n)*[^\n]*", text)
        assert deploys and all("--s3-bucket" in deploy for deploy in deploys), (document, [d for d in deploys if "--s3-bucket" not in d])


@pytest.mark.parametrize("extra", ["", THIRD_TABLE], ids=["declared", "with-two-more"])
def test_each_role_may_write_only_its_own_tables_under_the_warehouse(extra):
    """Issue 69: the runs' role names each declared table's Iceberg files (a streamed one's tombstones too), the Spark
    job's the exported tables' only; no grant covers the whole warehouse, and the catalog's writes name the tables."""
    from ddb_athena_build.templates import iceberg_tables_of

    tables = [*declared_tables().values(), *(parse_declarations(extra).values() if extra else [])]
    body = load_template(rendered("ddb_athena.yaml", tables))
    every = {name for table in tables for name in iceberg_tables_of(table)}
    exported = {name for table in tables if table.kind == "exported" for name in iceberg_tables_of(table)}
    for role, expected in (("DagsterRunRole", every), ("SparkJobRole", exported)):
        text = json.dumps(body["Resources"][role]["Properties"])
        assert "/warehouse/*" not in text and '"warehouse/*"' not in text, role
        assert set(re.findall(r"/warehouse/\$\{GlueDatabaseName\}\.db/(\w+)/\*", text)) == expected, role
        assert set(re.findall(r"warehouse/\$\{GlueDatabaseName\}\.db/(\w+)/\*\"", text)) == expected, role  # listed too
        writes = [statement for statement in json.dumps(body["Resources"][role]).split('"Sid": ') if "glue:UpdateTable" in statement]
        assert writes and all("table/${GlueDatabaseName}/*" not in statement for statement in writes), role
