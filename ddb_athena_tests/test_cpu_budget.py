"""The sync run's CPU budget: a token bucket over its processes' CPU that makes cycles wait when it is spent."""

import subprocess
import sys
import time

import psutil
import pytest

from ddb_athena.cpu_budget import BURST_SHARE, CpuBudget, ProcessTreeCpu
from ddb_athena.cycle_loop import run_cycles
from ddb_athena_tests.test_cycle_loop import FakeClock


class FakeCpu:
    def __init__(self):
        self.spent = 0.0

    def __call__(self) -> float:
        return self.spent


def test_a_run_within_its_budget_never_waits_and_a_spent_budget_waits_for_its_refill():
    clock, cpu = FakeClock(), FakeCpu()
    budget = CpuBudget(per_minute=10, cpu=cpu, clock=clock)
    assert budget.burst == 60 * BURST_SHARE * 10 and budget.refill_per_second == pytest.approx(9 / 60)
    for _ in range(30):  # 1 CPU-s every 10 s: 6 a minute, under the budget
        clock.now += 10
        cpu.spent += 1
        assert budget.wait_seconds() == 0
    clock.now += 10  # the bucket is full again (it never holds more than the burst)
    cpu.spent += 60 + 3  # a burst beyond it
    assert budget.wait_seconds() == pytest.approx(3 / (9 / 60))
    clock.now += 20  # the refill pays the deficit at 0.15 CPU-s a second
    assert budget.wait_seconds() == 0
    assert budget.average_per_minute() == pytest.approx((30 + 63) * 60 / 330)


def test_the_bucket_holds_at_most_the_burst_however_long_the_run_was_idle():
    clock, cpu = FakeClock(), FakeCpu()
    budget = CpuBudget(per_minute=10, cpu=cpu, clock=clock)
    clock.now += 3600
    cpu.spent += budget.burst + 1.5
    assert budget.wait_seconds() == pytest.approx(1.5 / budget.refill_per_second)


@pytest.mark.parametrize(("cycle_cpu", "expected_intervals"), [(1.0, {10.0}), (2.5, None)])
def test_over_a_whole_run_the_loop_spends_at_most_the_budget_and_merges_no_less_often_than_the_longest_interval(cycle_cpu, expected_intervals):
    """A fast host (1 CPU-s a cycle, 6 a minute at 10 s) keeps the interval; a slow one (2.5, 15 a minute) is paced
    to the budget, its intervals between 10 and 20 s. A first cycle with a JVM start spends 20 CPU-s either way."""
    clock, cpu, starts = FakeClock(), FakeCpu(), []
    budget = CpuBudget(per_minute=10, cpu=cpu, clock=clock)

    def cycle(number):
        starts.append(clock.now)
        cpu.spent += 20 if number == 1 else cycle_cpu
        clock.now += 1.5

    run_cycles(cycle, 10, 3600, clock=clock, sleep=clock.sleep, throttle=budget.wait_seconds, longest_interval_seconds=20)
    intervals = {round(b - a, 6) for a, b in zip(starts, starts[1:])}
    assert cpu.spent <= 10 * 60 + cycle_cpu  # the budget of the hour, give or take the last cycle
    assert min(intervals) >= 10 and max(intervals) <= 20
    assert budget.cut_waits == 0  # every wait the budget asked for was made in full (a 20-CPU-s first cycle too)
    if expected_intervals:
        assert intervals == expected_intervals
    else:
        assert cpu.spent * 60 / clock.now > 9.5  # paced to the budget, not below it
        assert len(intervals) > 1


def test_a_host_whose_cycle_costs_more_than_the_longest_interval_refills_keeps_that_interval_and_counts_the_cut_waits():
    # 4 CPU-s a cycle; 20 s of refill pays 3. Freshness first: cycles stay 20 s apart and the sync overspends.
    clock, cpu, starts = FakeClock(), FakeCpu(), []
    budget = CpuBudget(per_minute=10, cpu=cpu, clock=clock)

    def cycle(number):
        starts.append(clock.now)
        cpu.spent += 4
        clock.now += 1.5

    run_cycles(cycle, 10, 3600, clock=clock, sleep=clock.sleep, throttle=budget.wait_seconds, longest_interval_seconds=20)
    assert max(b - a for a, b in zip(starts, starts[1:])) == pytest.approx(20)
    assert cpu.spent > 10 * 60 and budget.balance < 0
    assert budget.cut_waits > len(starts) / 2


def test_a_restart_forgets_what_was_spent_before_it():
    clock, cpu = FakeClock(), FakeCpu()
    budget = CpuBudget(per_minute=10, cpu=cpu, clock=clock)
    clock.now, cpu.spent = 30, 100  # a bootstrap: far beyond the burst
    assert budget.wait_seconds() > 0
    budget.restart()
    assert budget.wait_seconds() == 0 and budget.balance == budget.burst
    clock.now, cpu.spent = 90, 106
    assert budget.average_per_minute() == pytest.approx(6)


def test_a_budget_needs_a_positive_rate():
    for per_minute in (0, -1):
        with pytest.raises(ValueError):
            CpuBudget(per_minute, cpu=FakeCpu())


def test_a_run_inherits_the_bucket_its_predecessor_left_refilled_since_and_never_beyond_the_burst():
    clock, cpu = FakeClock(), FakeCpu()
    budget = CpuBudget(per_minute=10, cpu=cpu, clock=clock)
    budget.inherit(-5, seconds_since=10)  # the predecessor owed 5 CPU-s; 10 s of refill at 0.15 a second since
    assert budget.balance == pytest.approx(-3.5) and budget.wait_seconds() == pytest.approx(3.5 / 0.15)
    budget.inherit(50, seconds_since=3600)
    assert budget.balance == budget.burst


def test_a_handover_draws_on_the_bucket_the_run_before_left_so_an_hour_across_it_keeps_the_budget():
    """Two 30-minute runs on a host whose cycles cost what the bucket refills (1.5 CPU-s every 10 s, 9 a minute):
    the first spends its credit on maintenance near its end, the second's start (a JVM, cold cycles) costs 40
    CPU-s more. Handed on, the bucket makes the second run pay for its start by waiting; a bucket of its own
    would let it spend a whole burst again (any hour across the handover: 635 CPU-s)."""

    def hour_across_the_handover(inherit: bool) -> float:
        clock, cpu, spent_at = FakeClock(), FakeCpu(), {}

        def run(budget: CpuBudget, extra: dict[int, float]) -> None:
            def cycle(number):
                spent_at[clock.now] = cpu.spent
                cpu.spent += 1.5 + extra.get(number, 0.0)
                clock.now += 1.5

            run_cycles(cycle, 10, 1800, clock=clock, sleep=clock.sleep, throttle=budget.wait_seconds, longest_interval_seconds=20)

        first = CpuBudget(per_minute=10, cpu=cpu, clock=clock)
        run(first, {170: 55.0})  # maintenance in the run's last minutes spends the bucket
        second = CpuBudget(per_minute=10, cpu=cpu, clock=clock)
        if inherit:
            second.inherit(first.balance, seconds_since=0)
        run(second, {1: 40.0})
        spent_at[clock.now] = cpu.spent
        times = sorted(spent_at)
        return max(spent_at[end] - spent_at[start] for start in times for end in times if 0 < end - start <= 3600)

    assert hour_across_the_handover(inherit=True) <= 10 * 60
    assert hour_across_the_handover(inherit=False) > 10 * 60


def _own_cpu() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def test_the_process_tree_meter_counts_children_and_keeps_what_an_ended_child_used():
    meter, own_before = ProcessTreeCpu(), _own_cpu()
    burn = "import sys, time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\nsys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE)
    try:
        process = psutil.Process(child.pid)
        while sum(process.cpu_times()[:2]) < 0.4:
            time.sleep(0.05)
        while_running = meter()
        assert while_running - (_own_cpu() - own_before) >= 0.4  # the child's, not this process's own
    finally:
        child.communicate(b"")
    # The child has ended and been reaped; its CPU stays counted, and the count never goes back.
    assert meter() >= while_running
