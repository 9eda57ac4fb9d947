"""bench/peak_beside.py: the sgemm peak measured beside each timed training run and the median
fraction of it that bench/run_bench.py and bench/workloads.py report.

Run by ctest (bench_yardsticks) with ONNXTRAIN_BENCH_SGEMM naming onnxtrain-bench-sgemm.
"""
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import peak_beside  # noqa: E402


def test_median_fraction_divides_each_run_by_its_own_peak():
    # 0.5 GFLOP a step: 400 steps/s is 200 GFLOP/s, 80 % of a 250 peak and 100 % of a 200 one.
    runs = [(400.0, 250.0), (300.0, 200.0), (400.0, 200.0)]
    assert peak_beside.median_fraction(runs, 0.5) == pytest.approx(0.8)  # of 0.8, 0.75, 1.0
    # Against one peak for every run the same rates read otherwise: the pairing counts.
    assert peak_beside.median_fraction([(r, 250.0) for r, _ in runs], 0.5) == pytest.approx(0.8)
    assert peak_beside.median_fraction([(400.0, 200.0), (300.0, 250.0)], 0.5) == pytest.approx((1.0 + 0.6) / 2)


def test_median_fraction_without_runs_is_none():
    assert peak_beside.median_fraction([], 1.0) is None
    assert peak_beside.median_fraction([(10.0, 0.0)], 1.0) is None  # a failed measurement counts for nothing


@pytest.mark.skipif("ONNXTRAIN_BENCH_SGEMM" not in os.environ, reason="run by ctest, which names the tool")
def test_sgemm_gflops_measures_the_tool():
    gflops = peak_beside.sgemm_gflops(os.environ["ONNXTRAIN_BENCH_SGEMM"], 1)
    # One thread of any machine this runs on does between 1 and 10,000 GFLOP/s at 2048^3.
    assert 1.0 < gflops < 1e4
