"""The sync run's loop: cycles one interval apart until the run's time is up; stop signals held until a cycle ends."""

import os
import signal

import pytest

from ddb_athena.cycle_loop import StopRequest, run_cycles
from ddb_athena_tests.fake_clock import FakeClock


def test_cycles_start_one_interval_apart_back_to_back_when_slow_and_stop_at_the_run_time():
    clock, starts = FakeClock(), []

    def cycle(number):
        starts.append((number, round(clock.now, 6)))
        clock.now += 3 if number != 3 else 14  # the third cycle overruns its interval

    ran = run_cycles(cycle, interval_seconds=10, run_seconds=60, clock=clock, sleep=clock.sleep)
    assert starts == [(1, 0), (2, 10), (3, 20), (4, 34), (5, 44), (6, 54)] and ran == 6
    # No seventh cycle could start by 60 s: the run ends when the sixth does, not idle until 60 s.
    assert clock.now == 57


def test_a_cycle_that_overruns_the_run_time_is_the_last():
    clock, starts = FakeClock(), []

    def cycle(number):
        starts.append(round(clock.now, 6))
        clock.now += 3 if number != 2 else 50  # the second cycle ends past the run time

    assert run_cycles(cycle, interval_seconds=10, run_seconds=30, clock=clock, sleep=clock.sleep) == 2
    assert starts == [0, 10] and clock.now == 60


def test_a_throttle_makes_the_next_cycle_wait_up_to_the_longest_interval():
    clock, starts, longest_waits = FakeClock(), [], []
    waits = iter([0, 12, 30, 0, 30])

    def cycle(number):
        starts.append(round(clock.now, 6))
        clock.now += 3 if number != 5 else 25  # the fifth cycle overruns even the longest interval

    def throttle(longest_wait):
        longest_waits.append(round(longest_wait, 6))
        return next(waits)

    ran = run_cycles(cycle, 10, 80, clock=clock, sleep=clock.sleep, throttle=throttle, longest_interval_seconds=20)
    # No wait: the interval. 12 s after a 3-s cycle: 15. 30: held to the longest, 20. An overrun: back to back.
    assert starts == [0, 10, 25, 45, 55] and ran == 5
    # The throttle is told the most the loop will wait: to 20 s after the cycle's start (an overrun: less than none).
    assert longest_waits == [17, 17, 17, 17, -5]


def test_a_longest_interval_below_the_interval_is_the_interval():
    clock, starts = FakeClock(), []
    run_cycles(lambda n: starts.append(clock.now), 10, 25, clock=clock, sleep=clock.sleep, throttle=lambda longest_wait: 60, longest_interval_seconds=5)
    assert starts == [0, 10, 20]


def test_a_run_time_of_zero_is_one_cycle_and_bad_settings_are_refused():
    assert run_cycles(lambda number: None, interval_seconds=10, run_seconds=0) == 1
    for interval, run in ((0, 60), (-1, 60), (10, -1)):
        with pytest.raises(ValueError):
            run_cycles(lambda number: None, interval_seconds=interval, run_seconds=run)


def test_a_stop_signal_during_a_cycle_lets_it_finish_then_reaches_the_previous_handler():
    received, finished = [], []

    class Stopped(Exception):
        pass

    def previous_handler(number, frame):
        received.append(number)
        raise Stopped()

    def cycle(number):
        os.kill(os.getpid(), signal.SIGTERM)  # as a run launcher terminating the run would
        finished.append(number)  # still runs: the signal is held

    original = signal.signal(signal.SIGTERM, previous_handler)
    try:
        with pytest.raises(Stopped):
            run_cycles(cycle, interval_seconds=0.01, run_seconds=60)
        assert signal.getsignal(signal.SIGTERM) is previous_handler
    finally:
        signal.signal(signal.SIGTERM, original)
    assert finished == [1] and received == [signal.SIGTERM]


def test_nothing_is_delivered_without_a_stop():
    stop = StopRequest()
    assert run_cycles(lambda number: None, interval_seconds=10, run_seconds=0, stop=stop) == 1 and not stop.requested
