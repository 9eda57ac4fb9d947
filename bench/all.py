#!/usr/bin/env python3
"""Every comparison of docs/performance.md in one command: the Fashion-MNIST MLP and CNN
(bench/run_bench.py: training against PyTorch 2.13, inference against ONNX Runtime 1.30) and
ResNet-18, the BERT encoder and the LSTM (bench/workloads.py: training against PyTorch eager and
torch.compile, inference against ONNX Runtime), each workload's position against the sgemm
peak and against oneDNN's own kernels at its shapes timed alone (bench/gemm_peak.py,
bench/conv_peak.py), one after the other, each writing its tables into its section of
docs/performance.md.
About 7 minutes on the 2-core AVX-512 development machine with the defaults below (8 on the
AVX2 one, 492 s at c79b832); on a slower
machine the timed step counts shrink with its sgemm peak (below), so that each timed run lasts
about as long as there. Run it on an otherwise idle machine (bench/shared_cores.py measures the
loaded case on its own).

Usage: .venv/bin/python bench/all.py [--no-docs] [--full-steps]   (after scripts/build release)
"""
import argparse
import json
import os
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)

# Repetitions and timed step counts, chosen on a machine whose oneDNN sgemm peak (2048^3, 2
# threads) was REFERENCE_PEAK GFLOP/s so that the whole run stayed near 7 minutes there; the
# fewest steps any machine runs (a timed run shorter than ~1 s is mostly noise on these VMs).
REFERENCE_PEAK = 490.0
FASHION_MNIST_STEPS = {"mlp": 150, "cnn": 150}
FASHION_MNIST_FLOORS = {"mlp": 150, "cnn": 40}  # the MLP's 150 steps take ~1 s on a 4x slower machine
WORKLOAD_STEPS = {"resnet18": 20, "bert": 6, "lstm": 8}
# Since 2026-11-29 the workloads' floors are their full counts: at 3 timed BERT steps one slow
# phase of the VM decided the ratio (0.97 in the bench at d8f50a4, 1.21-1.33 by hand minutes
# later), and the full counts add ~30 s on a machine with half the reference peak.
WORKLOAD_FLOORS = dict(WORKLOAD_STEPS)


def sgemm_peak():
    """oneDNN's sgemm at 2048^3 on 2 threads, GFLOP/s (bench/bench_sgemm.cpp)."""
    tool = os.path.join(ROOT, "build", "release", "bench", "onnxtrain-bench-sgemm")
    out = subprocess.run([tool, "--threads", "2"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)["gflops"]


def runs(scale):
    """(script, arguments) with the step counts times `scale` (at most 1), never below the floors."""
    steps = lambda n, floor: max(floor, round(n * scale))
    listed = lambda counts, floors: ",".join(f"{k}={steps(v, floors[k])}" for k, v in counts.items())
    return [("run_bench.py", ["--reps", "3", "--steps", listed(FASHION_MNIST_STEPS, FASHION_MNIST_FLOORS)]),
            ("workloads.py", ["--reps", "3", "--steps", listed(WORKLOAD_STEPS, WORKLOAD_FLOORS)])]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-docs", action="store_true", help="print the tables without writing docs/performance.md")
    parser.add_argument("--full-steps", action="store_true",
                        help=f"the step counts chosen at {REFERENCE_PEAK:.0f} GFLOP/s whatever this machine's peak")
    args = parser.parse_args()
    started = time.perf_counter()
    scale = 1.0
    if not args.full_steps:
        peak = sgemm_peak()
        scale = min(1.0, peak / REFERENCE_PEAK)
        print(f"sgemm peak {peak:.0f} GFLOP/s: timed step counts x {scale:.2f} (--full-steps keeps them)", flush=True)
    for script, arguments in runs(scale):
        command = [sys.executable, os.path.join(BENCH, script)] + arguments + ([] if args.no_docs else ["--write-docs"])
        print("$ " + " ".join(command[1:]), flush=True)
        begun = time.perf_counter()
        if subprocess.run(command).returncode != 0:
            print(f"error: {script} failed; the sections it writes were left as they were", file=sys.stderr)
            return 1
        print(f"({script}: {time.perf_counter() - begun:.0f} s)", flush=True)
    print(f"all benchmarks: {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
