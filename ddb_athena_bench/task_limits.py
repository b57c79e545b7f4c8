"""A Fargate task's size on this machine, for a benchmark: the CPU quota ECS sets (CFS: `vcpu` x 100 ms of CPU every
100 ms) and a memory limit, as cgroup v1 groups (root). The CPU group holds the sync's process from before its JVM starts
(the JVM sizes its threads from the quota, as in a task), and every process it starts; a thread that is not the
sync's (a load generator) is moved out. The memory
group holds the JVM and its workers (started within it): this process also holds the benchmark's table served from
memory, which the task would not, so it leaves the group once they run, and the run worker's own share
(`RUN_WORKER_GB`) is taken off the task's memory for them.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
MEMORY_ROOT = Path("/sys/fs/cgroup/memory")
PERIOD_MICROSECONDS = 100_000
# The run worker's Python (Dagster, the sync's loop, boto3): ~0.3 GB measured beside a sync run.
RUN_WORKER_GB = 0.5


class TaskLimitsUnavailable(RuntimeError):
    pass


class TaskLimits:
    def __init__(self, name: str, vcpu: float, memory_gb: float):
        self.vcpu, self.memory_gb = vcpu, memory_gb
        self.cpu, self.memory = CPU_ROOT / name, MEMORY_ROOT / name

    def __enter__(self) -> "TaskLimits":
        if not os.access(CPU_ROOT, os.W_OK) or not os.access(MEMORY_ROOT, os.W_OK):
            raise TaskLimitsUnavailable(f"cgroup v1 groups cannot be made here ({CPU_ROOT}, {MEMORY_ROOT} not writable): run as root on cgroup v1")
        for group in (self.cpu, self.memory):
            group.mkdir()  # refused if it exists: a group's limits are one task's
        (self.cpu / "cpu.cfs_period_us").write_text(str(PERIOD_MICROSECONDS))
        (self.cpu / "cpu.cfs_quota_us").write_text(str(int(self.vcpu * PERIOD_MICROSECONDS)))
        (self.memory / "memory.limit_in_bytes").write_text(str(int((self.memory_gb - RUN_WORKER_GB) * 2**30)))
        for group in (self.cpu, self.memory):
            (group / "cgroup.procs").write_text(str(os.getpid()))
        return self

    @property
    def spark_master(self) -> str:
        """Spark's task threads for the quota: as many as whole vCPUs, at least one."""
        return f"local[{max(1, int(self.vcpu))}]"

    def exempt_thread(self, thread_id: int) -> None:
        """A thread of this process that is not the task's work (cgroup v1 places threads one by one)."""
        (CPU_ROOT / "tasks").write_text(str(thread_id))

    def release_this_process_memory(self) -> None:
        """Once the JVM and Spark's workers have started (within the group): this process leaves the memory group, so
        that the table it serves from memory, which a task would not hold, is not counted. Memory already charged
        stays with the group until freed (cgroup v1 does not move it)."""
        (MEMORY_ROOT / "cgroup.procs").write_text(str(os.getpid()))

    @contextmanager
    def cpu_unlimited(self) -> Iterator[None]:
        """Within the block, the group's processes take every core: work that prepares a measurement, not part of it."""
        (self.cpu / "cpu.cfs_quota_us").write_text("-1")
        try:
            yield
        finally:
            (self.cpu / "cpu.cfs_quota_us").write_text(str(int(self.vcpu * PERIOD_MICROSECONDS)))

    def throttled_seconds(self) -> float:
        stats = dict(line.split() for line in (self.cpu / "cpu.stat").read_text().splitlines())
        return int(stats["throttled_time"]) / 1e9

    def __exit__(self, *exc) -> None:
        for group, root in ((self.cpu, CPU_ROOT), (self.memory, MEMORY_ROOT)):
            for pid in (group / "cgroup.procs").read_text().split():
                try:
                    (root / "cgroup.procs").write_text(pid)
                except OSError:
                    continue  # gone meanwhile
            group.rmdir()
