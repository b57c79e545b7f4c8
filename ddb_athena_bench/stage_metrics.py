"""Where a sync's Spark time goes, by statement: Spark's own event log (`spark.eventLog.enabled`), each stage's task
metrics summed to the SQL execution that ran it, and the executions grouped by what they ran (a MERGE, the tombstone
lookup, a compaction slice, a collect). `cost.py --spark-event-log DIR` writes the log; this reads it:

    .venv/bin/python -m ddb_athena_bench.stage_metrics .ddb_athena/bench/stage-events/<app-id> [--since EPOCH_SECONDS]

A statement's wall time beyond its stages' is the driver's own: Iceberg's planning (manifests) and its commit.
"""

import argparse
import collections
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

SQL_START = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart"
SQL_END = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionEnd"
# Stage totals Spark keeps (internal.metrics.<name>): run and CPU time of the tasks, bytes read and shuffled.
METRICS = {
    "executorRunTime": "task_seconds",
    "executorCpuTime": "task_cpu_seconds",
    "input.bytesRead": "input_bytes",
    "input.recordsRead": "input_records",
    "shuffle.read.localBytesRead": "shuffle_read_bytes",
    "shuffle.read.remoteBytesRead": "shuffle_read_bytes",
    "shuffle.write.bytesWritten": "shuffle_write_bytes",
    "output.bytesWritten": "output_bytes",
}
SCALE = {"task_seconds": 1e-3, "task_cpu_seconds": 1e-9}


@dataclass
class Execution:
    kind: str
    started_ms: int
    ended_ms: int = 0
    stages: int = 0
    tasks: int = 0
    totals: collections.Counter = field(default_factory=collections.Counter)


def statement_kind(description: str, plan_root: str) -> str:
    """What an execution ran: the Python call site Spark records (`collect at cycle.py:312`; a statement run by
    `spark.sql` has none, its site is Java's) and the root of its physical plan (`WriteDelta` for a merge-on-read MERGE,
    `Execute CreateViewCommand`...), without the names and literals that differ from cycle to cycle."""
    action, _, site = description.partition(" at ")
    site = "" if site.startswith("NativeMethodAccessorImpl") else f" at {Path(site).name}"
    return f"{action}{site}: {plan_root}"


def read(path: Path) -> dict[int, Execution]:
    executions: dict[int, Execution] = {}
    stage_execution: dict[int, int] = {}
    root: dict[int, int] = {}
    with path.open() as events:
        for line in events:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:  # the last line of a log still being written
                break
            kind = event["Event"]
            if kind == SQL_START:
                # A statement's own executions (a CTAS's insert, a procedure's rewrites) count in the statement's.
                root[event["executionId"]] = root.get(event.get("rootExecutionId", -1), event["executionId"])
                if root[event["executionId"]] == event["executionId"]:
                    plan_root = event.get("sparkPlanInfo", {}).get("nodeName", "")
                    executions[event["executionId"]] = Execution(statement_kind(event.get("description", ""), plan_root), event["time"])
            elif kind == SQL_END and event["executionId"] in executions:
                executions[event["executionId"]].ended_ms = event["time"]
            elif kind == "SparkListenerJobStart":
                execution_id = (event.get("Properties") or {}).get("spark.sql.execution.id")
                if execution_id is not None:
                    stage_execution.update({stage: root.get(int(execution_id), int(execution_id)) for stage in event["Stage IDs"]})
            elif kind == "SparkListenerStageCompleted":
                info = event["Stage Info"]
                execution = executions.get(stage_execution.get(info["Stage ID"], -1))
                if execution is None:
                    continue
                execution.stages += 1
                execution.tasks += info["Number of Tasks"]
                for accumulable in info.get("Accumulables", []):
                    name = accumulable.get("Name", "").removeprefix("internal.metrics.")
                    if name in METRICS:
                        execution.totals[METRICS[name]] += int(accumulable["Value"])
    return executions


def summary(executions: dict[int, Execution], since_ms: int = 0) -> list[dict]:
    """One row per kind of statement, in the executions begun since `since_ms`: counts, then per execution."""
    groups: dict[str, list[Execution]] = collections.defaultdict(list)
    for execution in executions.values():
        if execution.started_ms >= since_ms and execution.ended_ms:
            groups[execution.kind].append(execution)
    rows = []
    for kind, members in groups.items():
        count = len(members)
        totals = sum((member.totals for member in members), collections.Counter())
        wall = sum(member.ended_ms - member.started_ms for member in members) / 1e3
        row = {"statement": kind, "executions": count, "wall_seconds": wall / count, "stages": sum(m.stages for m in members) / count}
        row["tasks"] = sum(member.tasks for member in members) / count
        row.update({name: totals[name] * SCALE.get(name, 1) / count for name in sorted(set(METRICS.values()))})
        rows.append(row)
    return sorted(rows, key=lambda row: -row["wall_seconds"] * row["executions"])


def table(rows: list[dict]) -> str:
    lines = [
        "| statement | runs | wall s (each) | task s | task CPU s | stages | tasks | input MB | records | shuffle read MB | shuffle write MB | output MB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| `{row['statement']}` | {row['executions']} | {row['wall_seconds']:.2f} | {row['task_seconds']:.2f} | {row['task_cpu_seconds']:.2f} | "
            f"{row['stages']:.1f} | {row['tasks']:.0f} | {row['input_bytes'] / 1e6:.1f} | {row['input_records']:,.0f} | "
            f"{row['shuffle_read_bytes'] / 1e6:.1f} | {row['shuffle_write_bytes'] / 1e6:.1f} | {row['output_bytes'] / 1e6:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("event_log", type=Path, help="a Spark event log file (spark.eventLog.dir/<application id>)")
    parser.add_argument("--since", type=float, default=0.0, help="only executions begun from this time (epoch seconds)")
    arguments = parser.parse_args(argv)
    print(table(summary(read(arguments.event_log), int(arguments.since * 1000))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
