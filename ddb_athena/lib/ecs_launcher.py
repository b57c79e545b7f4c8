"""The run launcher of a deployment on ECS (deploy/dagster.yaml): dagster-aws's EcsRunLauncher, and the one thing ECS
and it do not do. A task Fargate Spot cannot place (RunTask: "Capacity is unavailable at this time") is launched on
regular Fargate at once, saying so in the run's log and on the alert topic: ECS never falls back by itself, and the
launcher's own retries would wait minutes for Spot capacity that may not come back for hours."""

from dagster_aws.ecs import EcsRunLauncher
from dagster_aws.ecs.utils import RetryableEcsException

from ddb_athena.lib import alert_topic
from ddb_athena.lib.resources import sync_settings
from ddb_athena.lib.run_capacity import ON_DEMAND, SPOT, capacity_strategy
from ddb_athena.lib.settings import Settings

NO_SPOT_CAPACITY = "Capacity is unavailable at this time"


def _on_spot(run_task_kwargs: dict) -> bool:
    return any(entry.get("capacityProvider") == SPOT for entry in run_task_kwargs.get("capacityProviderStrategy") or [])


def _run_id(run_task_kwargs: dict) -> str | None:
    return next((tag["value"] for tag in run_task_kwargs.get("tags", []) if tag.get("key") == "dagster/run_id"), None)


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
