"""Where a run's ECS task runs: Fargate Spot or regular Fargate (the sync resource's `run_capacity`, from the
deployment's RunCapacity parameter). The sync and cleanup runs carry it as the tag dagster-aws's EcsRunLauncher reads
RunTask's arguments from; runs clicked in the UI take regular Fargate (the instance's default)."""

import json

SPOT, ON_DEMAND = "FARGATE_SPOT", "FARGATE"
RUN_TASK_KWARGS_TAG = "ecs/run_task_kwargs"


def capacity_strategy(capacity: str) -> list[dict]:
    return [{"capacityProvider": capacity, "weight": 1}]


def capacity_tags(capacity: str) -> dict[str, str]:
    return {RUN_TASK_KWARGS_TAG: json.dumps({"capacityProviderStrategy": capacity_strategy(capacity)})}
