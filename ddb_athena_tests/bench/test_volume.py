"""The volume benchmark's report says who held a step back: the writes, the emulator, or the sync."""

from ddb_athena_bench.volume import bottleneck

STEP = {"rate": 100, "achieved_rate": 99, "emulator_cpu": 20.0, "cycles_behind": 0.0, "sync_cpu": 14.0}


def test_a_step_that_kept_up_says_so_and_one_that_did_not_names_who():
    assert bottleneck(STEP) == "nothing: kept up"
    # The emulator at its ceiling: it served neither the writes nor the stream fast enough.
    saturated = {**STEP, "achieved_rate": 63, "emulator_cpu": 43.0, "cycles_behind": 0.7}
    assert bottleneck(saturated) == "writes: 63 of 100/s (the emulator); capture behind: the emulator (43 CPU-s/min) serves its stream and S3"
    assert bottleneck({**STEP, "achieved_rate": 50}) == "writes: 50 of 100/s (the load generator)"
    assert bottleneck({**STEP, "cycles_behind": 2.0, "sync_cpu": 80.0}) == "capture behind: the sync (80 CPU-s/min)"
