"""Each table's freshness check: red when its asset's last materialization is older than the table's bound
(`freshness_minutes`), or when it has none.

A sensor evaluates it and records the verdict itself, with no run: on ECS every run is a Fargate task (a minute's
minimum, an address, the image pulled), and a run every few minutes to read the event log would be a task a table
cost no line of the bill priced. The sensor runs in the daemon whether or not a sync runs, so a stalled pipeline
turns the check red within a tick. It records a verdict when it changes, and at least every RECORD_EVERY while it
holds (the check's metadata stays current, the event log small). The same check runs from the UI like any other.
"""

import json
import time
from dataclasses import dataclass
from datetime import timedelta

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetKey,
    DagsterInstance,
    DefaultSensorStatus,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    TimestampMetadataValue,
    asset_check,
    sensor,
)

# The names Dagster's own freshness check and sensor had: an existing instance keeps their history and state.
FRESHNESS_CHECK_NAME = "freshness_check"
FRESHNESS_SENSOR_NAME = "freshness_checks_sensor"
# How often the sensor looks: a check turns red at most this long after its bound passed.
SENSOR_INTERVAL_SECONDS = 30
RECORD_EVERY = timedelta(minutes=10)


@dataclass(frozen=True)
class FreshnessBound:
    asset_key: AssetKey
    bound: timedelta

    def evaluate(self, instance: DagsterInstance, now: float) -> AssetCheckEvaluation:
        latest = instance.get_latest_materialization_event(self.asset_key)
        updated = latest.timestamp if latest else None
        lower_bound = now - self.bound.total_seconds()
        passed = updated is not None and updated >= lower_bound
        metadata = {"bound_seconds": self.bound.total_seconds(), "lower_bound": TimestampMetadataValue(lower_bound)}
        if updated is None:
            description = f"Never materialized: expected an update within {self.bound}."
        else:
            age = timedelta(seconds=round(now - updated))
            metadata |= {"last_updated": TimestampMetadataValue(updated), "fresh_until": TimestampMetadataValue(updated + self.bound.total_seconds())}
            description = f"Last update {age} ago: {'within' if passed else 'past'} the bound of {self.bound}."
        return AssetCheckEvaluation(
            asset_key=self.asset_key,
            check_name=FRESHNESS_CHECK_NAME,
            passed=passed,
            metadata=metadata,
            severity=AssetCheckSeverity.WARN,
            description=description,
        )


def freshness_check(checked: FreshnessBound) -> AssetChecksDefinition:
    @asset_check(
        name=FRESHNESS_CHECK_NAME,
        asset=checked.asset_key,
        description=f"Updated within the last {checked.bound}. Evaluated with no run by {FRESHNESS_SENSOR_NAME}; run it here to evaluate it now.",
    )
    def freshness(context: AssetCheckExecutionContext) -> AssetCheckResult:
        evaluation = checked.evaluate(context.instance, time.time())
        return AssetCheckResult(passed=evaluation.passed, metadata=evaluation.metadata, severity=evaluation.severity, description=evaluation.description)

    return freshness


def _recorded(cursor: str | None) -> dict[str, list]:
    """By check, [passed, when recorded]; a cursor of Dagster's own sensor of this name is not ours: start anew."""
    try:
        recorded = json.loads(cursor) if cursor else {}
    except ValueError:
        return {}
    return recorded if isinstance(recorded, dict) else {}


def freshness_sensor(bounds: list[FreshnessBound]) -> SensorDefinition:
    @sensor(name=FRESHNESS_SENSOR_NAME, minimum_interval_seconds=SENSOR_INTERVAL_SECONDS, default_status=DefaultSensorStatus.RUNNING)
    def evaluate_freshness(context: SensorEvaluationContext) -> SensorResult:
        recorded, now, evaluations = _recorded(context.cursor), time.time(), []
        for checked in bounds:
            evaluation = checked.evaluate(context.instance, now)
            name = checked.asset_key.to_user_string()
            passed_before, recorded_at = recorded.get(name, (None, 0.0))
            if evaluation.passed != passed_before or now - recorded_at >= RECORD_EVERY.total_seconds():
                evaluations.append(evaluation)
                recorded[name] = [evaluation.passed, now]
        return SensorResult(asset_events=evaluations, cursor=json.dumps(recorded, sort_keys=True))

    return evaluate_freshness
