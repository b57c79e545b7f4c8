"""Alerts through the emulator's SNS to an SQS queue subscribed to the topic, as a person's email would be: one message
an incident (a job starting to fail, a check turning red, and green again), not one a cycle, with links, no item data."""

import json

import pytest
from dagster import AssetCheckEvaluation, AssetKey, DagsterInstance, build_run_status_sensor_context, build_sensor_context

from ddb_athena.alerts.sensors import NO_TOPIC, alert_on_failed_run, alert_on_red_checks
from ddb_athena.definitions import defs
from ddb_athena.lib.resources import AwsClientsResource, sync_settings
from ddb_athena_tests.books_and_orders import books_source_cleanup

DAGSTER_URL = "https://dagster.example.com"


@pytest.fixture
def topic_and_queue(settings):
    sns, sqs = settings.client("sns"), settings.client("sqs")
    topic = sns.create_topic(Name="ddb-athena-alerts")["TopicArn"]
    queue_url = sqs.create_queue(QueueName="a-person")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "false"})
    return topic, queue_url


def received(settings, queue_url) -> list[dict]:
    """Every message the queue holds (SNS's envelope: Subject, Message)."""
    messages = []
    while batch := settings.client("sqs").receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", []):
        for message in batch:
            messages.append(json.loads(message["Body"]))
            settings.client("sqs").delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    return messages


def alert_resources(settings, topic: str | None) -> dict:
    aws = AwsClientsResource(region_name=settings.region, endpoint_url=settings.endpoint_url)
    return {"aws": aws, "sync": sync_settings(settings, alert_topic_arn=topic, dagster_url=DAGSTER_URL)}


@pytest.fixture
def resources(settings, topic_and_queue):
    return alert_resources(settings, topic_and_queue[0])


def evaluate_checks(instance, resources, cursor):
    with build_sensor_context(instance=instance, cursor=cursor, repository_def=defs.get_repository_def(), resources=resources) as context:
        alert_on_red_checks(context)
        return context.cursor


def report(instance, passed: bool):
    instance.report_runless_asset_event(AssetCheckEvaluation(asset_key=AssetKey("books_iceberg"), check_name="books_backlog", passed=passed))


def test_a_check_red_over_ten_cycles_is_one_message_and_its_return_to_green_another(settings, topic_and_queue, resources):
    _, queue_url = topic_and_queue
    with DagsterInstance.ephemeral() as instance:
        cursor = evaluate_checks(instance, resources, None)
        report(instance, passed=True)
        cursor = evaluate_checks(instance, resources, cursor)
        assert received(settings, queue_url) == []  # green from the start: nothing to say
        for _ in range(10):
            report(instance, passed=False)
            cursor = evaluate_checks(instance, resources, cursor)
        (red,) = received(settings, queue_url)
        assert red["Subject"] == "ddb_athena: check books_backlog on books_iceberg failed"
        assert f"{DAGSTER_URL}/assets/books_iceberg?view=checks" in red["Message"]
        for _ in range(3):
            report(instance, passed=True)
            cursor = evaluate_checks(instance, resources, cursor)
        (green,) = received(settings, queue_url)
        assert green["Subject"] == "ddb_athena: check books_backlog on books_iceberg passes again"


def cleanup_run(instance, resources, bucket: str):
    manifests = [] if bucket == "ok" else ["books_source/_manifests/m.json"]
    config = {"ops": {"delete_committed_change_files": {"config": {"bucket": bucket, "manifest_keys": manifests}}}}
    return books_source_cleanup.execute_in_process(instance=instance, run_config=config, resources={"aws": resources["aws"]}, raise_on_error=False)


def evaluate_failure(instance, resources, result):
    context = build_run_status_sensor_context(
        sensor_name="alert_on_failed_run",
        dagster_event=result.get_run_failure_event(),
        dagster_instance=instance,
        dagster_run=result.dagster_run,
        resources=resources,
    ).for_run_failure()
    return alert_on_failed_run(context)


def test_a_job_that_keeps_failing_is_one_message_until_a_run_of_it_succeeds(settings, topic_and_queue, resources):
    _, queue_url = topic_and_queue
    with DagsterInstance.ephemeral() as instance:
        first = cleanup_run(instance, resources, "no-such-bucket")
        assert not first.success
        evaluate_failure(instance, resources, first)
        (message,) = received(settings, queue_url)
        assert message["Subject"] == "ddb_athena: books_source_cleanup failed"
        assert f"{DAGSTER_URL}/runs/{first.dagster_run.run_id}" in message["Message"]
        for _ in range(3):
            evaluate_failure(instance, resources, cleanup_run(instance, resources, "no-such-bucket"))
        assert received(settings, queue_url) == []
        assert cleanup_run(instance, resources, "ok").success
        evaluate_failure(instance, resources, cleanup_run(instance, resources, "no-such-bucket"))
        (again,) = received(settings, queue_url)
        assert again["Subject"] == "ddb_athena: books_source_cleanup failed"


def test_without_a_topic_the_sensors_skip_saying_so(settings, topic_and_queue):
    unset = alert_resources(settings, None)
    with DagsterInstance.ephemeral() as instance:
        report(instance, passed=False)
        with build_sensor_context(instance=instance, repository_def=defs.get_repository_def(), resources=unset) as context:
            assert alert_on_red_checks(context).skip_message == NO_TOPIC
        result = cleanup_run(instance, unset, "no-such-bucket")
        assert evaluate_failure(instance, unset, result).skip_message == NO_TOPIC
    assert received(settings, topic_and_queue[1]) == []
