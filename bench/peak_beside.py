"""The sgemm peak measured beside each timed onnxtrain training run, for the fraction of the peak
that bench/run_bench.py and bench/workloads.py report next to the one against the run's peak.

This VM's speed changes between minutes (its sgemm at 2048^3 read 202 GFLOP/s at the start of one
bench run and 219 after it; a ResNet-18 step took 41.7 ms in one run and 56.5-57.2 in the three
before it, docs/performance.md): a step timed in a slow minute against a peak measured in a fast
one reads as a lower fraction of the machine than it used, and the other way round. So each timed
onnxtrain run is preceded by an sgemm measurement at the machine's thread count (a few seconds
earlier, the same minute), each run's fraction is its GFLOP/s over that peak, and the reported
figure is the median of those fractions at onnxtrain's best thread count. The run's peak (the
larger of the runs' whole-script measurements) stays the headline figure; this one shows whether
a shortfall against it is the step's or the minute's.
"""
import json
import statistics
import subprocess

REPEATS = 10  # 2048^3 products per measurement beside a run (0.1 s each at ~200 GFLOP/s; the fastest counts)
RUN_REPEATS = 20  # per measurement of the run's peak (before and after the runs: the scripts' headline figure)


def sgemm_gflops(tool, threads, repeats=REPEATS, timeout=120):
    """oneDNN's sgemm at 2048^3 on `threads` threads, the fastest of `repeats` (onnxtrain-bench-sgemm),
    GFLOP/s. Raises subprocess.CalledProcessError or TimeoutExpired when the tool fails."""
    out = subprocess.run([tool, "--threads", str(threads), "--repeats", str(repeats)], capture_output=True,
                         text=True, check=True, timeout=timeout).stdout
    return json.loads(out)["gflops"]


def median_fraction(runs, gflop_per_step):
    """runs: [(steps/s, GFLOP/s of the sgemm beside the run)] -> median of rate * GFLOP / peak, or None."""
    fractions = [rate * gflop_per_step / peak for rate, peak in runs if peak > 0]
    return statistics.median(fractions) if fractions else None
