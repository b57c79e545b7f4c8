"""The sync run's loop: cycles one interval apart until the run's time is up; stop signals held until a cycle ends."""

import os
import signal

import pytest

from ddb_athena.streamed.run_loop import StopRequest, run_cycles
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


def test_idle_cycles_back_off_doubling_up_to_the_idle_interval_and_a_busy_one_brings_the_interval_back():
    clock, starts = FakeClock(), []
    busy = iter([True, False, False, False, True, False, True])

    def cycle(number):
        starts.append(round(clock.now, 6))
        clock.now += 1
        return next(busy)

    ran = run_cycles(cycle, 5, 70, clock=clock, sleep=clock.sleep, idle_interval_seconds=20)
    # Busy: 5 s. Idle: 10, 20, then held at 20. Busy again: 5. Idle: 10. Busy: 5.
    assert starts == [0, 5, 15, 35, 55, 60] and ran == 6


def test_an_idle_interval_below_the_interval_is_the_interval():
    clock, starts = FakeClock(), []
    run_cycles(lambda n: starts.append(clock.now), 10, 25, clock=clock, sleep=clock.sleep, idle_interval_seconds=5)
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


def test_a_signal_ridden_out_keeps_the_loop_cycling_back_to_back_and_its_last_cycle_ends_within_the_grace():
    clock, starts, decided = FakeClock(), [], []

    def rides_out(number):
        decided.append(number)
        return number == signal.SIGTERM

    stop = StopRequest(rides_out, grace_seconds=100)

    def cycle(number):
        starts.append(clock.now)
        if number == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # ECS stopping the task, 10 s into the run
        clock.now += 5 if number != 3 else 12  # the longest cycle: 12 s
        return number != 6  # the sixth finds nothing to merge

    before = signal.getsignal(signal.SIGTERM)
    ran = run_cycles(cycle, interval_seconds=10, run_seconds=3600, stop=stop, clock=clock, sleep=clock.sleep, idle_interval_seconds=60)
    assert decided == [signal.SIGTERM] and stop.ridden_out_at == 10 and not stop.requested
    # From the signal on, every cycle is followed at once, the idle sixth too (not 20 s later, backing off); none
    # starts that a cycle as long as the longest of the last five could not end by 10 + 100 s (the 12-s one bounds the
    # starts until four cycles have followed it).
    assert starts == [0, 10, 15, *range(27, 103, 5)] and ran == 19
    assert clock.now == 107 <= 10 + 100
    assert signal.getsignal(signal.SIGTERM) is before  # nothing delivered, handlers back


def test_a_signal_not_ridden_out_and_a_second_one_during_the_grace_stop_the_loop_after_the_cycle():
    received = []

    def previous_handler(number, frame):
        received.append(number)

    for rides_out, second, cycles in ((lambda number: False, None, 1), (lambda number: True, 3, 3)):
        clock, received[:] = FakeClock(), []
        stop = StopRequest(rides_out, grace_seconds=100)

        def cycle(number, clock=clock, second=second):
            if number in (1, second):
                os.kill(os.getpid(), signal.SIGTERM)
            clock.now += 1

        original = signal.signal(signal.SIGTERM, previous_handler)
        try:
            assert run_cycles(cycle, interval_seconds=10, run_seconds=3600, stop=stop, clock=clock, sleep=clock.sleep) == cycles
        finally:
            signal.signal(signal.SIGTERM, original)
        assert received == [signal.SIGTERM]
