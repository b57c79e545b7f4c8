"""deploy/dagster_ecs.yaml, Dagster itself on ECS beside the data stack: lint-clean; the UI reachable from the given
addresses only, the database from the tasks only; never two daemons; gateway endpoints; every variable the instance
and the code read is set, from the data stack's one choice of capture; and a deployment into the emulator beside a
data stack, of every resource type moto can create."""

import json
import re

import pytest
import yaml
from cfnlint.api import ManualArgs, lint_file

from ddb_athena.lib.settings import REPO_ROOT
from ddb_athena_tests.deploy.policies import PLATFORM_TEMPLATE as TEMPLATE
from ddb_athena_tests.deploy.policies import load_template as data_template
from ddb_athena_tests.deploy.test_template import assert_named_and_scoped, created_stack, data_stack, policy_statements

INSTANCE = REPO_ROOT / "deploy" / "dagster.yaml"
# IAM actions without resource-level permissions.
UNSCOPABLE_ACTIONS = {
    "ecs:DescribeTaskDefinition",
    "ec2:DescribeNetworkInterfaces",
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
    "logs:DescribeLogGroups",  # the agent finds the exec sessions' log group (AWS's ECS Exec guide grants it so)
}
# What moto 5.2.5 lacks for this stack: RDS's managed-secret attribute (its CloudFormation knows only the endpoint's),
# and the data stack's Glue database (not emulated there, so not exported).
SECRET_ATTRIBUTE = "Database.MasterUserSecret.SecretArn"
MASTER_USER = "dagster"
# What Fargate sets in every container of a task (the instance's IAM tokens are signed for the region).
FARGATE_VARIABLES = {"AWS_REGION", "AWS_DEFAULT_REGION"}
GLUE_DATABASE_IMPORT = {"Fn::ImportValue": {"Fn::Sub": "${DataStackName}-GlueDatabaseName"}}


def template() -> dict:
    return data_template(TEMPLATE)


def task_container(name: str) -> dict:
    (container,) = [found for found in template()["Resources"]["PlatformTaskDefinition"]["Properties"]["ContainerDefinitions"] if found["Name"] == name]
    return container


def platform_container() -> dict:
    return task_container("platform")


def test_cfn_lint_finds_nothing_not_even_informational():
    assert lint_file(TEMPLATE, config=ManualArgs(include_checks=["I"])) == []


def test_no_address_reaches_the_tasks_the_ui_only_through_session_manager_and_the_database_from_the_tasks_only():
    resources = template()["Resources"]
    # Nothing to open, so nothing an operator can open to 0.0.0.0/0.
    assert "SecurityGroupIngress" not in resources["TaskSecurityGroup"]["Properties"]
    assert not [name for name, resource in resources.items() if resource["Type"] == "AWS::EC2::SecurityGroupIngress"]
    assert not [name for name in template()["Parameters"] if "Cidr" in name]
    assert resources["PlatformService"]["Properties"]["EnableExecuteCommand"] is True
    channels = [statement for name, statement in policy_statements(resources) if name == "PlatformRole" and statement["Sid"] == "SessionManagerChannels"]
    assert channels and all(action.startswith("ssmmessages:") for action in channels[0]["Action"])
    viewer = {statement["Sid"]: statement for name, statement in policy_statements(resources) if name == "OperatorViewerPolicy"}
    admin = {statement["Sid"]: statement for name, statement in policy_statements(resources) if name == "OperatorAdminPolicy"}
    cluster_tasks = {"Fn::Sub": "arn:${AWS::Partition}:ecs:${AWS::Region}:${AWS::AccountId}:task/${Cluster}/*"}
    forwarding = {"Fn::Sub": "arn:${AWS::Partition}:ssm:${AWS::Region}::document/AWS-StartPortForwardingSession"}
    assert viewer["DescribeThePlatformTask"]["Resource"] == cluster_tasks
    # Issue 69: a viewer forwards the UI's port and nothing else (the session must name its document); only an
    # administrator opens a shell, in the platform container alone, and every session is logged.
    assert viewer["ForwardTheUi"]["Resource"] == [cluster_tasks, forwarding]
    assert viewer["ForwardTheUi"]["Condition"] == {"BoolIfExists": {"ssm:SessionDocumentAccessCheck": "true"}}
    assert not [statement for statement in viewer.values() if "ecs:ExecuteCommand" in str(statement["Action"])]
    assert list(admin) == ["ShellInThePlatformContainer"] and admin["ShellInThePlatformContainer"]["Action"] == "ecs:ExecuteCommand"
    assert admin["ShellInThePlatformContainer"]["Resource"] == [{"Fn::GetAtt": ["Cluster", "Arn"]}, cluster_tasks]
    assert admin["ShellInThePlatformContainer"]["Condition"] == {"StringEquals": {"ecs:container-name": "platform"}}
    logging = resources["Cluster"]["Properties"]["Configuration"]["ExecuteCommandConfiguration"]
    assert logging["Logging"] == "OVERRIDE"
    assert logging["LogConfiguration"]["CloudWatchLogGroupName"] == resources["ExecSessionLogGroup"]["Properties"]["LogGroupName"]
    assert template()["Parameters"]["DagsterUrl"]["Default"] == "http://localhost:3000"  # where the forwarding puts it
    (database_ingress,) = resources["DatabaseSecurityGroup"]["Properties"]["SecurityGroupIngress"]
    assert database_ingress["SourceSecurityGroupId"] == {"Ref": "TaskSecurityGroup"} and database_ingress["FromPort"] == 5432
    database = resources["Database"]["Properties"]
    assert database["PubliclyAccessible"] is False and database["StorageEncrypted"] is True and database["ManageMasterUserPassword"] is True
    assert "MasterUserPassword" not in database


def test_an_update_never_runs_two_daemons():
    service = template()["Resources"]["PlatformService"]["Properties"]
    assert service["DesiredCount"] == 1
    deployment = service["DeploymentConfiguration"]
    assert (deployment["MinimumHealthyPercent"], deployment["MaximumPercent"]) == (0, 100)


def test_the_runs_capacity_is_the_deployments_choice_spot_by_default_and_a_stopped_task_gets_the_syncs_grace():
    from typing import get_args

    from ddb_athena.lib.resources import SyncSettings
    from ddb_athena.streamed.handover import STOP_TIMEOUT_SECONDS

    parameter = template()["Parameters"]["RunCapacity"]
    field = SyncSettings.model_fields["run_capacity"]
    assert parameter["Default"] == field.default == "FARGATE_SPOT" and set(parameter["AllowedValues"]) == set(get_args(field.annotation))
    cluster = template()["Resources"]["Cluster"]["Properties"]
    assert set(cluster["CapacityProviders"]) == {"FARGATE", "FARGATE_SPOT"}
    variables = {variable["Name"]: variable["Value"] for variable in platform_container()["Environment"]}
    assert variables["DDB_ATHENA_RUN_CAPACITY"] == {"Ref": "RunCapacity"}
    # Every run's task inherits the platform container's stop timeout: the grace a sync run ends within.
    assert platform_container()["StopTimeout"] == STOP_TIMEOUT_SECONDS


def test_the_database_stays_creatable_grows_before_it_fills_and_is_deleted_only_when_asked_keeping_a_snapshot():
    parameters, database = template()["Parameters"], template()["Resources"]["Database"]
    properties = database["Properties"]
    # A major version alone, minors applied by RDS: a pinned minor stops being creatable once RDS retires it.
    assert re.fullmatch(r"\d+", properties["EngineVersion"]) and properties["AutoMinorVersionUpgrade"] is True
    assert properties["MaxAllocatedStorage"] == {"Ref": "DatabaseMaxStorageGiB"}
    assert parameters["DatabaseMaxStorageGiB"]["Default"] > parameters["DatabaseStorageGiB"]["Default"]
    assert parameters["DatabaseMaxStorageGiB"]["MinValue"] > parameters["DatabaseStorageGiB"]["MinValue"]
    assert properties["DeletionProtection"] == {"Ref": "DatabaseDeletionProtection"}
    assert parameters["DatabaseDeletionProtection"]["Default"] == "true"
    assert database["DeletionPolicy"] == database["UpdateReplacePolicy"] == "Snapshot"


def test_s3_and_dynamodb_have_gateway_endpoints_that_let_through_this_deployments_buckets_and_tables_only():
    from ddb_athena.lib.declarations import declared_tables

    endpoints = {
        endpoint["ServiceName"]["Fn::Sub"].rsplit(".", 1)[1]: endpoint
        for endpoint in (resource["Properties"] for resource in template()["Resources"].values() if resource["Type"] == "AWS::EC2::VPCEndpoint")
    }
    assert sorted(endpoints) == ["dynamodb", "s3"] and all(endpoint["VpcEndpointType"] == "Gateway" for endpoint in endpoints.values())
    policies = {}
    for service, endpoint in endpoints.items():
        condition, restricted, unrestricted = endpoint["PolicyDocument"]["Fn::If"]
        assert condition == "RestrictEndpoints" and unrestricted == {"Ref": "AWS::NoValue"}  # the default policy allows everything
        policies[service] = {statement["Sid"]: statement for statement in restricted["Statement"]}
    assert template()["Parameters"]["RestrictGatewayEndpoints"]["Default"] == "true"
    buckets = json.dumps(policies["s3"]["ThisDeploymentsBuckets"]["Resource"])
    assert "-BucketName" in buckets and "-CodeBucketName" in buckets
    assert policies["s3"]["EcrImageLayers"]["Resource"] == {"Fn::Sub": "arn:${AWS::Partition}:s3:::prod-${AWS::Region}-starport-layer-bucket/*"}
    assert len(policies["dynamodb"]["ThisDeploymentsTables"]["Resource"]) == 2 * len(declared_tables())  # a table and what is under it


def _instance_variables() -> set[str]:
    """The variables deploy/dagster.yaml reads (`{env: NAME}` and `env: NAME`)."""
    return set(re.findall(r"\benv: (\w+)", INSTANCE.read_text()))


def test_the_platform_sets_every_variable_the_instance_reads_and_holds_no_password():
    container = platform_container()
    environment = {variable["Name"]: variable["Value"] for variable in container["Environment"]}
    assert {"DAGSTER_POSTGRES_HOST", "DDB_ATHENA_BUCKET", "DAGSTER_RUN_FAMILY_PREFIX"} <= _instance_variables() <= set(environment) | FARGATE_VARIABLES
    assert "Secrets" not in container and not any("PASSWORD" in name for name in environment)
    assert environment["DAGSTER_POSTGRES_USER"] != MASTER_USER


def test_the_instance_logs_in_as_its_own_role_with_iam_tokens_and_only_the_setup_container_reads_the_master_password():
    resources = template()["Resources"]
    assert resources["Database"]["Properties"]["EnableIAMDatabaseAuthentication"] is True
    assert resources["Database"]["Properties"]["MasterUsername"] == MASTER_USER
    role = {variable["Name"]: variable["Value"] for variable in platform_container()["Environment"]}["DAGSTER_POSTGRES_USER"]
    setup = task_container("database-setup")
    setup_variables = {variable["Name"]: variable["Value"] for variable in setup["Environment"]}
    assert setup["Command"] == ["ddb-athena", "database-role"]
    assert (setup_variables["DAGSTER_POSTGRES_USER"], setup_variables["DAGSTER_POSTGRES_MASTER_USER"]) == (role, MASTER_USER)
    assert setup["Secrets"] == [{"Name": "DAGSTER_POSTGRES_MASTER_PASSWORD", "ValueFrom": {"Fn::Sub": "${" + SECRET_ATTRIBUTE + "}:password::"}}]
    # It runs to its end before the platform starts, at every start (the password as it is then).
    assert setup["Essential"] is False and platform_container()["DependsOn"] == [{"ContainerName": "database-setup", "Condition": "SUCCESS"}]
    # The platform's role and the runs' (the data stack's, by name) may connect as that role and no other.
    login = {"Fn::Sub": "arn:${AWS::Partition}:rds-db:${AWS::Region}:${AWS::AccountId}:dbuser:${Database.DbiResourceId}/" + role}
    platform_logins = [statement for name, statement in policy_statements(resources) if statement["Action"] == "rds-db:connect"]
    assert platform_logins and all(statement["Resource"] == login for statement in platform_logins)
    runs = resources["RunsDatabaseLogin"]["Properties"]
    assert runs["Roles"] == [{"Fn::ImportValue": {"Fn::Sub": "${DataStackName}-" + name}} for name in ("DagsterRunRoleName", "DagsterCleanupRoleName")]
    assert [statement["Resource"] for statement in runs["PolicyDocument"]["Statement"] if statement["Action"] == "rds-db:connect"] == [login]
    assert "DagsterRunRoleName" in data_template()["Outputs"]


def test_the_capture_is_the_data_stacks_one_choice_read_from_its_parameter_not_an_export_and_its_default_is_the_codes():
    from ddb_athena.lib.resources import SyncSettings

    variables = {variable["Name"]: variable["Value"] for variable in platform_container()["Environment"]}
    assert "DDB_ATHENA_BOOKS_CAPTURE" not in variables
    assert variables["DDB_ATHENA_STACK_SETTINGS_PARAMETER"] == {"Fn::Sub": "/ddb_athena/${DataStackName}/settings"}
    data = data_template()
    assert data["Resources"]["StackSettingsParameter"]["Properties"]["Name"] == {"Fn::Sub": "/ddb_athena/${AWS::StackName}/settings"}
    assert "Export" not in data["Outputs"]["BooksCapture"]  # an imported export could not change in place
    assert data["Parameters"]["BooksCapture"]["Default"] == SyncSettings.model_fields["books_capture"].default


def test_every_import_is_an_export_of_the_data_stack():
    text = json.dumps(template())
    imported = set(re.findall(r'"Fn::Sub": "\$\{DataStackName\}-(\w+)"', text))
    exported = {output["Export"]["Name"]["Fn::Sub"].removeprefix("${AWS::StackName}-") for output in data_template()["Outputs"].values() if "Export" in output}
    assert imported and imported <= exported, imported - exported


def test_policies_name_their_actions_and_scope_their_resources():
    statements = list(policy_statements(template()["Resources"]))
    # RunExecutionRole has AWS's managed policy alone.
    assert {name for name, _ in statements} == {"ExecutionRole", "PlatformRole", "RunsDatabaseLogin", "OperatorViewerPolicy", "OperatorAdminPolicy"}
    assert_named_and_scoped(statements, UNSCOPABLE_ACTIONS)


def test_no_task_the_platform_starts_can_read_the_databases_secret():
    """Issue 69: the runs' tasks start under an execution role with no secret, and the platform's role may pass only
    that one: the role that reads the master secret (the setup container's) is CloudFormation's to pass."""
    resources = template()["Resources"]
    run_execution = resources["RunExecutionRole"]["Properties"]
    assert "Policies" not in run_execution and run_execution["ManagedPolicyArns"] == [
        {"Fn::Sub": "arn:${AWS::Partition}:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy"}
    ]
    (passing,) = [statement for name, statement in policy_statements(resources) if statement.get("Sid") == "PassTheRunsRoles"]
    assert {"Fn::GetAtt": ["RunExecutionRole", "Arn"]} in passing["Resource"] and {"Fn::GetAtt": ["ExecutionRole", "Arn"]} not in passing["Resource"]
    secret_readers = [name for name, statement in policy_statements(resources) if "secretsmanager:GetSecretValue" in str(statement["Action"])]
    assert secret_readers == ["ExecutionRole"]


def test_the_instance_launches_runs_under_the_platforms_prefix_with_the_runs_role():
    launcher = yaml.safe_load(INSTANCE.read_text())["run_launcher"]["config"]
    assert launcher["task_definition_prefix"] == {"env": "DAGSTER_RUN_FAMILY_PREFIX"} and launcher["use_current_ecs_task_config"] is True
    variables = {variable["Name"]: variable["Value"] for variable in platform_container()["Environment"]}
    assert variables["DAGSTER_CURRENT_IMAGE"] == {"Ref": "ImageUri"}
    context, values = variables["DAGSTER_CONTAINER_CONTEXT"]["Fn::Sub"]
    context = context.replace("${RunRoleArn}", "arn").replace("${RunExecutionRole.Arn}", "execution-arn")
    assert json.loads(context) == {"ecs": {"task_role_arn": "arn", "execution_role_arn": "execution-arn"}}
    assert values == {"RunRoleArn": {"Fn::ImportValue": {"Fn::Sub": "${DataStackName}-DagsterRunRoleArn"}}}
    (launch,) = [statement for name, statement in policy_statements(template()["Resources"]) if statement.get("Sid") == "LaunchRuns"]
    assert any("task-definition/${RunFamilyPrefix}_*" in resource["Fn::Sub"] for resource in launch["Resource"])


def emulated_platform(secret_arn: str, database: str) -> dict:
    """The template with the values moto cannot give: the managed secret's ARN, the database's resource id (its IAM
    logins' ARN), and the Glue database's name."""
    text = json.dumps(template()).replace("${Database.DbiResourceId}", "db-EMULATED")
    for attribute, value in ((json.dumps({"Fn::GetAtt": SECRET_ATTRIBUTE.split(".", 1)}), json.dumps(secret_arn)), ("${" + SECRET_ATTRIBUTE + "}", secret_arn)):
        text = text.replace(attribute, value)
    text = text.replace(json.dumps(GLUE_DATABASE_IMPORT), json.dumps(database))
    assert SECRET_ATTRIBUTE not in text and "GlueDatabaseName" not in text
    return json.loads(text)


@pytest.mark.subprocess
def test_the_platform_deploys_into_the_emulator_beside_a_data_stack(settings, tmp_path):
    cloudformation, ec2 = settings.client("cloudformation"), settings.client("ec2")
    data_outputs = {output["OutputKey"]: output["OutputValue"] for output in data_stack(settings, tmp_path)["Outputs"]}

    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{number}.0/24", AvailabilityZone=f"us-east-1{zone}")["Subnet"]["SubnetId"]
        for number, zone in ((1, "a"), (2, "b"))
    ]
    route_table = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    # The database's managed secret, as RDS would make it (moto's CloudFormation has no such attribute).
    secret = settings.client("secretsmanager").create_secret(Name="rds!db-test", SecretString='{"username": "dagster", "password": "p"}')["ARN"]
    body = emulated_platform(secret, settings.namespace)
    parameters = {
        "DataStackName": "ddb-athena",
        "ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/ddb-athena@sha256:" + "0" * 64,
        "VpcId": vpc,
        "SubnetIds": ",".join(subnets),
        "RouteTableIds": route_table,
    }
    outputs = {output["OutputKey"]: output["OutputValue"] for output in created_stack(cloudformation, "ddb-athena-dagster", body, parameters)["Outputs"]}

    ecs = settings.client("ecs")
    (service,) = ecs.describe_services(cluster=outputs["ClusterName"], services=[outputs["PlatformServiceName"]])["services"]
    definition = ecs.describe_task_definition(taskDefinition=service["taskDefinition"])["taskDefinition"]
    containers = {found["name"]: found for found in definition["containerDefinitions"]}
    container, setup = containers["platform"], containers["database-setup"]
    variables = {variable["name"]: variable["value"] for variable in container["environment"]}
    assert variables["DDB_ATHENA_BUCKET"] == data_outputs["BucketName"] and variables["DDB_ATHENA_NAMESPACE"] == settings.namespace
    assert variables["DDB_ATHENA_STACK_SETTINGS_PARAMETER"] == data_outputs["StackSettingsParameterName"]
    context = json.loads(variables["DAGSTER_CONTAINER_CONTEXT"])["ecs"]
    assert context["task_role_arn"] == data_outputs["DagsterRunRoleArn"] and "RunExecutionRole" in context["execution_role_arn"]
    assert variables["DAGSTER_POSTGRES_HOST"] == outputs["DatabaseEndpoint"]
    assert variables["DDB_ATHENA_ALERT_TOPIC_ARN"] == data_outputs["AlertTopicArn"] and variables["DDB_ATHENA_DAGSTER_URL"] == "http://localhost:3000"
    assert "secrets" not in container or container["secrets"] == []
    assert setup["secrets"] == [{"name": "DAGSTER_POSTGRES_MASTER_PASSWORD", "valueFrom": f"{secret}:password::"}]
    endpoints = ec2.describe_vpc_endpoints(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["VpcEndpoints"]
    assert sorted(endpoint["ServiceName"] for endpoint in endpoints) == ["com.amazonaws.us-east-1.dynamodb", "com.amazonaws.us-east-1.s3"]
    assert all(endpoint["RouteTableIds"] == [route_table] for endpoint in endpoints)


def test_a_run_takes_the_syncs_measured_task_unless_its_job_asks_for_less():
    from ddb_athena_bench.bill import Task
    from ddb_athena_bench.cost import DEFAULT_SPARK_MEMORY, DEFAULT_TASK
    from ddb_athena_tests.books_and_orders import books_source_cleanup, orders_export_cleanup

    variables = {variable["Name"]: variable["Value"] for variable in platform_container()["Environment"]}
    assert variables["DDB_ATHENA_SPARK_DRIVER_MEMORY"] == DEFAULT_SPARK_MEMORY
    resources = yaml.safe_load(INSTANCE.read_text())["run_launcher"]["config"]["run_resources"]
    # The bill's cells run within this size: the smallest measured to hold the sync (docs/performance-log.md).
    assert Task(int(resources["cpu"]) / 1024, int(resources["memory"]) / 1024) == DEFAULT_TASK
    for job in (books_source_cleanup, orders_export_cleanup):
        assert Task(int(job.tags["ecs/cpu"]) / 1024, int(job.tags["ecs/memory"]) / 1024).memory_gb < DEFAULT_TASK.memory_gb


def test_parliament_finds_nothing_in_the_operators_and_the_runs_database_policies():
    from ddb_athena_tests.deploy.policies import PLATFORM_PARAMETERS, Deployment, PlatformResolver, platform_imports
    from ddb_athena_tests.deploy.test_iam_coverage import parliament_findings

    deployment = Deployment(books_capture="run")
    resolver = PlatformResolver(template(), {**deployment.parameters("bucket"), **PLATFORM_PARAMETERS}, platform_imports("bucket", deployment.region))
    # A key parliament's database predates: AWS's own quickstart policies for Session Manager's users use it
    # (docs.aws.amazon.com/systems-manager/latest/userguide/getting-started-restrict-access-quickstart.html).
    known_to_aws = {("UNKNOWN_CONDITION_FOR_ACTION", "Unknown condition ssm:SessionDocumentAccessCheck for action ssm:StartSession")}
    for name in ("OperatorViewerPolicy", "OperatorAdminPolicy", "RunsDatabaseLogin"):
        document = resolver.resolve(template()["Resources"][name]["Properties"]["PolicyDocument"])
        assert set(parliament_findings(document["Statement"])) - known_to_aws == set(), name


ALERT_TOPIC = {"Fn::ImportValue": {"Fn::Sub": "${DataStackName}-AlertTopicArn"}}


def test_aws_itself_alerts_when_the_platform_task_or_its_database_fails_and_a_bad_deployment_rolls_back():
    from ddb_athena_bench.bill import PLATFORM_ALARMS

    resources = template()["Resources"]
    alarms = {name: resource["Properties"] for name, resource in resources.items() if resource["Type"] == "AWS::CloudWatch::Alarm"}
    assert {(alarm["Namespace"], alarm["MetricName"]) for alarm in alarms.values()} == {
        ("AWS/ECS", "CPUUtilization"),
        ("AWS/RDS", "FreeStorageSpace"),
        ("AWS/RDS", "CPUCreditBalance"),
    }
    assert all(alarm["AlarmActions"] == [ALERT_TOPIC] for alarm in alarms.values())
    assert len(alarms) == PLATFORM_ALARMS  # as many as the bill prices
    # No platform task, no datapoint: the alarm that watches the watcher fires on silence.
    assert (alarms["PlatformDownAlarm"]["TreatMissingData"], alarms["PlatformDownAlarm"]["ComparisonOperator"]) == ("breaching", "LessThanThreshold")
    assert resources["TaskFailedRule"]["Properties"]["Targets"][0]["Arn"] == ALERT_TOPIC
    service = resources["PlatformService"]["Properties"]
    assert service["DeploymentConfiguration"]["DeploymentCircuitBreaker"] == {"Enable": True, "Rollback": True}
    health = platform_container()["HealthCheck"]
    assert health["Command"] == ["CMD", "python", "/opt/ddb_athena/healthcheck.py"] and health["StartPeriod"] >= 120
    # The data stack's topic lets CloudWatch, EventBridge and RDS's events publish, for this account only.
    (statement,) = data_template()["Resources"]["AlertTopicPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert sorted(statement["Principal"]["Service"]) == ["cloudwatch.amazonaws.com", "events.amazonaws.com", "events.rds.amazonaws.com"]
    subscription = resources["DatabaseEventSubscription"]["Properties"]
    assert subscription["SnsTopicArn"] == ALERT_TOPIC and subscription["SourceIds"] == [{"Ref": "Database"}]
    assert {"failure", "failover", "low storage", "backup"} <= set(subscription["EventCategories"])
    assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}


def test_the_stopped_task_rule_is_for_this_clusters_tasks_stopped_with_a_non_zero_exit_or_before_they_ran():
    """Structure only: the emulator's EventBridge neither implements TestEventPattern nor looks inside an event's array
    of objects (`containers`), which EventBridge's matching does (an array matches when one element does). A task whose
    image or secret could not be fetched never ran: no exit code, its stoppedReason says why (issue 69)."""
    rule = template()["Resources"]["TaskFailedRule"]["Properties"]
    detail = rule["EventPattern"]["detail"]
    assert (rule["EventPattern"]["source"], rule["EventPattern"]["detail-type"]) == (["aws.ecs"], ["ECS Task State Change"])
    assert (detail["clusterArn"], detail["lastStatus"]) == ([{"Fn::GetAtt": ["Cluster", "Arn"]}], ["STOPPED"])
    exit_code, reasons, stop_code = detail["$or"]
    assert exit_code == {"containers": {"exitCode": [{"anything-but": 0}]}} and stop_code == {"stopCode": ["TaskFailedToStart"]}
    assert {"prefix": "CannotPullContainerError"} in reasons["stoppedReason"] and {"prefix": "ResourceInitializationError"} in reasons["stoppedReason"]
    assert set(rule["Targets"][0]["InputTransformer"]["InputPathsMap"].values()) == {"$.detail.taskArn", "$.detail.group", "$.detail.stoppedReason"}


def test_a_task_reaches_only_https_and_its_database_and_the_database_can_be_highly_available_and_logged():
    """Issue 69: egress is HTTPS anywhere (AWS's APIs) and PostgreSQL to the database's group, nothing else; the
    database's standby and its exported logs are parameters (the log on by default)."""
    body = template()
    resources, parameters = body["Resources"], body["Parameters"]
    (https,) = resources["TaskSecurityGroup"]["Properties"]["SecurityGroupEgress"]
    assert (https["IpProtocol"], https["FromPort"], https["ToPort"]) == ("tcp", 443, 443)
    egress = [resource["Properties"] for resource in resources.values() if resource["Type"] == "AWS::EC2::SecurityGroupEgress"]
    assert egress == [
        {
            "GroupId": {"Ref": "TaskSecurityGroup"},
            "Description": "PostgreSQL to the Dagster database",
            "IpProtocol": "tcp",
            "FromPort": 5432,
            "ToPort": 5432,
            "DestinationSecurityGroupId": {"Ref": "DatabaseSecurityGroup"},
        }
    ]
    database = resources["Database"]["Properties"]
    assert database["MultiAZ"] == {"Ref": "DatabaseMultiAz"} and parameters["DatabaseMultiAz"]["Default"] == "false"
    assert database["EnableCloudwatchLogsExports"] == {"Fn::If": ["WithDatabaseLogs", ["postgresql", "upgrade"], {"Ref": "AWS::NoValue"}]}
    assert parameters["DatabaseLogs"]["Default"] == "true"
    assert "NAT gateway" in parameters["AssignPublicIp"]["Description"] and "USD" in parameters["AssignPublicIp"]["Description"]


def test_what_the_data_stack_keeps_is_removed_when_its_first_create_rolls_back():
    """Issue 69: `Retain` left a failed first create's bucket, queues and database behind, and its retry failed on
    their names; RetainExceptOnCreate keeps them only once the stack exists."""
    policies = {name: resource["DeletionPolicy"] for name, resource in data_template()["Resources"].items() if "DeletionPolicy" in resource}
    assert "Retain" not in policies.values() and {"DataBucket", "GlueDatabase"} <= {name for name, kept in policies.items() if kept == "RetainExceptOnCreate"}


@pytest.mark.subprocess
def test_the_platform_refuses_to_serve_from_an_image_built_without_its_pinned_jars(tmp_path):
    """Issue 69: DOWNLOADS_OPTIONAL=1 (an offline build) bakes no pinned JAR and names them; the runs of such an image
    would download unpinned ones at every start. deploy/platform.sh stops before anything else, saying why."""
    import subprocess

    (tmp_path / "not-fetched.txt").write_text("iceberg-spark-runtime-3.5_2.12-1.10.2.jar\nhadoop-aws-3.3.4.jar\n")
    environment = {"PATH": "/usr/bin:/bin", "DDB_ATHENA_JAR_DIR": str(tmp_path)}
    refused = subprocess.run(["bash", str(REPO_ROOT / "deploy" / "platform.sh")], env=environment, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1
    assert "built offline, without what it pins (iceberg-spark-runtime-3.5_2.12-1.10.2.jar hadoop-aws-3.3.4.jar" in refused.stderr
    # Allowed (the suite's own image), it goes on to the schema's gate: no ddb-athena on this PATH, so it ends there.
    allowed_environment = {**environment, "DDB_ATHENA_ALLOW_UNPINNED_IMAGE": "1"}
    allowed = subprocess.run(["bash", str(REPO_ROOT / "deploy" / "platform.sh")], env=allowed_environment, capture_output=True, text=True, timeout=30)
    assert "built offline" not in allowed.stderr and "ddb-athena: command not found" in allowed.stderr
