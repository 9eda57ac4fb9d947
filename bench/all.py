#!/usr/bin/env python3
"""Every comparison of docs/performance.md in one command: the Fashion-MNIST MLP and CNN
(bench/run_bench.py: training against PyTorch 2.13, inference against ONNX Runtime 1.30) and
ResNet-18, the BERT encoder and the LSTM (bench/workloads.py: training against PyTorch eager and
torch.compile, inference against ONNX Runtime), each workload's position against the sgemm
peak and against oneDNN's own kernels at its shapes timed alone (bench/gemm_peak.py,
bench/conv_peak.py), one after the other, each writing its tables into its section of
docs/performance.md.
About 10 minutes on the 2-core development machine with the defaults below; run it on an
otherwise idle machine (bench/shared_cores.py measures the loaded case on its own).

Usage: .venv/bin/python bench/all.py [--no-docs]   (after scripts/build release)
"""
import argparse
import os
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))

# (script, arguments): repetitions and step counts chosen so the whole run stays near 10 minutes.
RUNS = [
    ("run_bench.py", ["--reps", "3", "--steps", "150"]),
    ("workloads.py", ["--reps", "2", "--steps", "resnet18=20,bert=6,lstm=8"]),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-docs", action="store_true", help="print the tables without writing docs/performance.md")
    args = parser.parse_args()
    started = time.perf_counter()
    for script, arguments in RUNS:
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
