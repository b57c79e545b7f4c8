"""Alerts that reach a person: an SNS topic (the data stack's AlertTopic; email or anything else subscribed to it)
hears of a job's runs starting to fail and of an asset check turning red, freshness checks included, once an incident
with a link to the run; again when the check is green. A job that keeps failing, or a check that stays red over many
sync cycles, says nothing more. Without DDB_ATHENA_ALERT_TOPIC_ARN the sensors skip, saying why.

A message names the job, the check and the run, never item data: a check's description and metadata stay in Dagster.
"""

import json

from dagster import (
    AssetCheckKey,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunFailureSensorContext,
    RunsFilter,
    SensorEvaluationContext,
    SkipReason,
    run_failure_sensor,
    sensor,
)
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from ddb_athena.lib import alert_topic
from ddb_athena.lib.resources import AwsClientsResource, SyncSettings

FINISHED = [DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED]
NO_TOPIC = "DDB_ATHENA_ALERT_TOPIC_ARN is not set: no alerts"


def link(sync: SyncSettings, path: str) -> str:
    return alert_topic.link(sync.dagster_url, path)


def publish(aws: AwsClientsResource, sync: SyncSettings, subject: str, lines: list[str]) -> None:
    alert_topic.publish(aws.client("sns"), sync.alert_topic_arn, subject, lines)


def starts_an_incident(context: RunFailureSensorContext) -> bool:
    """The run's failure is the first of its job since a run that did not fail: the job's earlier failures, back to its
    last success or cancel, already alerted."""
    run = context.dagster_run
    created = context.instance.get_run_record_by_id(run.run_id).create_timestamp
    (earlier,) = context.instance.get_runs(RunsFilter(job_name=run.job_name, statuses=FINISHED, created_before=created), limit=1) or (None,)
    return earlier is None or earlier.status != DagsterRunStatus.FAILURE


@run_failure_sensor(default_status=DefaultSensorStatus.RUNNING, monitor_all_code_locations=False)
def alert_on_failed_run(context: RunFailureSensorContext, aws: AwsClientsResource, sync: SyncSettings):
    if not sync.alert_topic_arn:
        return SkipReason(NO_TOPIC)
    if not starts_an_incident(context):
        return SkipReason(f"{context.dagster_run.job_name} was failing already: alerted at its first failure")
    run = context.dagster_run
    step_errors = [event.step_key for event in context.get_step_failure_events() if event.step_key]
    publish(
        aws,
        sync,
        f"ddb_athena: {run.job_name} failed",
        [
            f"The run {run.run_id} of {run.job_name} failed{' in ' + ', '.join(step_errors) if step_errors else ''}.",
            f"Run: {link(sync, f'/runs/{run.run_id}')}",
            "Its later failures send nothing until a run of the job succeeds.",
        ],
    )


def _check_states(cursor: str | None) -> dict[str, str]:
    return json.loads(cursor) if cursor else {}


@sensor(default_status=DefaultSensorStatus.RUNNING, minimum_interval_seconds=30)
def alert_on_red_checks(context: SensorEvaluationContext, aws: AwsClientsResource, sync: SyncSettings):
    """Each check's last state in the cursor (FAILED or SUCCEEDED): a message when one turns red, and when it is green
    again; nothing while it stays as it was."""
    if not sync.alert_topic_arn:
        return SkipReason(NO_TOPIC)
    check_keys = list(context.repository_def.asset_graph.asset_check_keys)
    latest = context.instance.event_log_storage.get_latest_asset_check_execution_by_key(check_keys)
    states, sent = _check_states(context.cursor), []
    for check_key, record in sorted(latest.items(), key=lambda item: item[0].to_user_string()):
        if record.status not in (AssetCheckExecutionRecordStatus.FAILED, AssetCheckExecutionRecordStatus.SUCCEEDED):
            continue  # planned, still running
        name, state = check_key.to_user_string(), record.status.value
        before = states.get(name)
        states[name] = state
        if state == before or (before is None and state == AssetCheckExecutionRecordStatus.SUCCEEDED.value):
            continue
        _publish_check(aws, sync, check_key, record.run_id, red=state == AssetCheckExecutionRecordStatus.FAILED.value)
        sent.append(name)
    context.update_cursor(json.dumps(states, sort_keys=True))
    return SkipReason(f"published: {', '.join(sent)}" if sent else "no check changed")


def _publish_check(aws: AwsClientsResource, sync: SyncSettings, check_key: AssetCheckKey, run_id: str, red: bool) -> None:
    asset = check_key.asset_key.to_user_string()
    what = "failed" if red else "passes again"
    publish(
        aws,
        sync,
        f"ddb_athena: check {check_key.name} on {asset} {what}",
        [
            f"The check {check_key.name} on {asset} {what}.",
            f"Checks of {asset}: {link(sync, '/assets/' + '/'.join(check_key.asset_key.path) + '?view=checks')}",
            *([f"The evaluation's run: {link(sync, f'/runs/{run_id}')}"] if run_id else []),  # none for a reported one
            "Nothing more is sent while it stays " + ("red." if red else "green."),
        ],
    )
