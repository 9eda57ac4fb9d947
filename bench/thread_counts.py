"""Which thread counts bench/run_bench.py and bench/workloads.py keep timing after the first
repetition. Each side of a comparison is reported at its best thread count; a count whose first
measurement is far behind another count's of the same side (speed below SLOWER times the best)
cannot become the best in the repetitions after, so it is not timed again. On the 2-core AVX2
VM every workload trained faster at 2 threads (the MLP at 147 against 96 steps/s in one
bench/shared_cores.py run), so the repetitions at 1 thread were time spent for no result.
"""

SLOWER = 0.75


def contending(first, t, higher_is_better=True):
    """Whether thread count t is timed again: `first` maps each thread count to its first
    measurement (steps/s when higher_is_better, else milliseconds); counts without one contend."""
    if t not in first:
        return True
    speed = {k: (v if higher_is_better else 1.0 / v) for k, v in first.items() if v > 0}
    return t not in speed or speed[t] >= SLOWER * max(speed.values())
