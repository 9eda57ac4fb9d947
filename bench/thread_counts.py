"""Which thread counts bench/run_bench.py and bench/workloads.py keep timing after the first
repetition. Each side of a comparison is reported at its best thread count; a count whose first
measurement is far behind another count's of the same side (speed below SLOWER times the best)
cannot become the best in the repetitions after, so it is not timed again. On the 2-core AVX2
VM, 1 thread trains at 0.5-0.7 of 2 threads' speed on every workload, so the repetitions at 1
thread took about a third of each script's time.
"""

SLOWER = 0.75


def contending(first, t, higher_is_better=True):
    """Whether thread count t is timed again: `first` maps each thread count to its first
    measurement (steps/s when higher_is_better, else milliseconds); counts without one contend."""
    if t not in first:
        return True
    speed = {k: (v if higher_is_better else 1.0 / v) for k, v in first.items() if v > 0}
    return t not in speed or speed[t] >= SLOWER * max(speed.values())
