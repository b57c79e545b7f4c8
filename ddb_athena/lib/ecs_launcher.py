"""The run launcher of a deployment on ECS (deploy/dagster.yaml): dagster-aws's EcsRunLauncher, and what ECS and it do
not do.

- Only the deployment decides what a run's task is. The UI has no login (it is reached through Session Manager), and
  anyone who opens it can tag a run; dagster-aws would pass the tags `ecs/task_overrides`, `ecs/container_overrides`
  and `ecs/run_task_kwargs` to RunTask (another task role, another command, another task definition). Here they are
  ignored, saying so in the run's log, but for the one choice a tag may make: Fargate Spot or regular Fargate. A cleanup
  job's task takes the cleanups' role (it deletes source files, never a warehouse file) because its job is one.
- A task Fargate Spot cannot place (RunTask: "Capacity is unavailable at this time") is launched on regular Fargate at
  once, saying so in the run's log and on the alert topic: ECS never falls back by itself, and the launcher's own
  retries would wait minutes for Spot capacity that may not come back for hours."""

import json
from collections.abc import Mapping
from typing import Any

from dagster._core.storage.dagster_run import DagsterRun
from dagster_aws.ecs import EcsRunLauncher
from dagster_aws.ecs.utils import RetryableEcsException

from ddb_athena.lib import alert_topic
from ddb_athena.lib.declarations import declared_tables
from ddb_athena.lib.resources import sync_settings
from ddb_athena.lib.run_capacity import ON_DEMAND, RUN_TASK_KWARGS_TAG, SPOT, capacity_strategy
from ddb_athena.lib.settings import Settings

NO_SPOT_CAPACITY = "Capacity is unavailable at this time"
# The tags dagster-aws turns into RunTask's arguments: no run's tags choose its role, command or task definition.
IGNORED_TAGS = ("ecs/task_overrides", "ecs/container_overrides", RUN_TASK_KWARGS_TAG)
CAPACITIES = (SPOT, ON_DEMAND)


def _on_spot(run_task_kwargs: dict) -> bool:
    return any(entry.get("capacityProvider") == SPOT for entry in run_task_kwargs.get("capacityProviderStrategy") or [])


def _run_id(run_task_kwargs: dict) -> str | None:
    return next((tag["value"] for tag in run_task_kwargs.get("tags", []) if tag.get("key") == "dagster/run_id"), None)


def _run_task_kwargs_tag(run: DagsterRun) -> dict:
    try:
        requested = json.loads(run.tags.get(RUN_TASK_KWARGS_TAG, "{}"))
    except json.JSONDecodeError:
        return {"unreadable": True}
    return requested if isinstance(requested, dict) else {"unreadable": True}


def requested_capacity(run: DagsterRun) -> list[dict] | None:
    """The capacity a run's tag asks for (the sync's and the cleanups' say the deployment's), when it is one of the two."""
    requested = _run_task_kwargs_tag(run).get("capacityProviderStrategy")
    return requested if requested in [capacity_strategy(capacity) for capacity in CAPACITIES] else None


def ignored_tags(run: DagsterRun) -> list[str]:
    """The run's tags that would choose more of its task than its capacity."""
    ignored = [tag for tag in IGNORED_TAGS if tag in run.tags and tag != RUN_TASK_KWARGS_TAG]
    if RUN_TASK_KWARGS_TAG in run.tags and (set(_run_task_kwargs_tag(run)) - {"capacityProviderStrategy"} or not requested_capacity(run)):
        ignored.append(RUN_TASK_KWARGS_TAG)
    return ignored


class SpotFallbackEcsRunLauncher(EcsRunLauncher):
    def _run_task(self, **run_task_kwargs):
        try:
            return super()._run_task(**run_task_kwargs)
        except RetryableEcsException as error:
            if not _on_spot(run_task_kwargs) or NO_SPOT_CAPACITY not in str(error):
                raise
        task = super()._run_task(**{**run_task_kwargs, "capacityProviderStrategy": capacity_strategy(ON_DEMAND)})
        self._report_fallback(_run_id(run_task_kwargs))
        return task

    def _get_task_overrides(self, container_context, run: DagsterRun) -> Mapping[str, Any]:
        overrides: dict[str, Any] = {}
        storage = container_context.run_resources.get("ephemeral_storage")
        if storage:
            overrides["ephemeralStorage"] = {"sizeInGiB": int(storage)}
        role = sync_settings(Settings.from_env()).cleanup_role_arn
        if role and run.job_name in {table.cleanup_job for table in declared_tables().values()}:
            overrides["taskRoleArn"] = role
        ignored = ignored_tags(run)
        if ignored:
            self._instance.report_engine_event(
                f"Ignored the run's tags {', '.join(ignored)}: a run's tags do not choose its task's role, command or "
                "definition (only Fargate Spot or regular Fargate, ecs/run_task_kwargs' capacityProviderStrategy, is taken)",
                run,
                cls=self.__class__,
            )
        return overrides

    def _get_container_overrides(self, run: DagsterRun) -> Mapping[str, Any]:
        return {}

    def _get_run_task_kwargs_from_run(self, run: DagsterRun) -> Mapping[str, Any]:
        capacity = requested_capacity(run)
        return {"capacityProviderStrategy": capacity} if capacity else {}

    def _report_fallback(self, run_id: str | None) -> None:
        message = "Fargate Spot had no capacity for this run's task: it was launched on regular Fargate (on-demand prices)"
        run = self._instance.get_run_by_id(run_id) if run_id else None
        if run is not None:
            self._instance.report_engine_event(message, run, cls=self.__class__)
        settings = Settings.from_env()
        sync = sync_settings(settings)
        if sync.alert_topic_arn:
            job = run.job_name if run else "a run"
            alert_topic.publish(
                settings.client("sns"),
                sync.alert_topic_arn,
                f"ddb_athena: {job} went on regular Fargate: no Spot capacity",
                [
                    f"{message}.",
                    *([f"Run: {alert_topic.link(sync.dagster_url, f'/runs/{run_id}')}"] if run_id else []),
                    "Each run asks Spot first again; runs keep going on regular Fargate while Spot has none.",
                ],
            )
