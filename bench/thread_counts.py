"""Which thread counts bench/run_bench.py and bench/workloads.py keep timing after the first
repetition. Each side of a comparison is reported at its best thread count; a count whose first
measurement is far behind another count's of the same side (speed below SLOWER times the best)
cannot become the best in the repetitions after, so it is not timed again. On the 2-core AVX2
VM every workload trained faster at 2 threads (the MLP at 147 against 96 steps/s in one
bench/shared_cores.py run), so the repetitions at 1 thread were time spent for no result.
"""

import os

SLOWER = 0.75


def contending(first, t, higher_is_better=True):
    """Whether thread count t is timed again: `first` maps each thread count to its first
    measurement (steps/s when higher_is_better, else milliseconds); counts without one contend."""
    if t not in first:
        return True
    speed = {k: (v if higher_is_better else 1.0 / v) for k, v in first.items() if v > 0}
    return t not in speed or speed[t] >= SLOWER * max(speed.values())


def onnxtrain_threads(threads):
    """(flags, environment) for `onnxtrain train` at `threads`: at as many threads as this process
    may use CPUs, onnxtrain's default (no --threads, no OMP_NUM_THREADS: the count follows the load
    and the command's threads spin as long as that default has them, src/cli/wait_policy.h; on an
    idle machine, one thread per CPU); fewer by --threads (a fixed count: its shorter spin)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if threads == len(os.sched_getaffinity(0)):
        return [], env
    env["OMP_NUM_THREADS"] = str(threads)
    return ["--threads", str(threads)], env


def recorded_threads_error(records, threads):
    """None when every step record of `onnxtrain train --metrics` ran `threads` threads, else the
    message saying which counts it ran."""
    ran = sorted({r["threads"] for r in records})
    return None if ran == [threads] else f"onnxtrain train ran {ran} threads, expected {threads} (is the machine idle?)"
