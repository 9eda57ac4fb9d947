#!/usr/bin/env python3
"""Data-parallel scaling on this machine (issue 17, docs/distributed.md): the Fashion-MNIST MLP
and CNN (examples/fashion_mnist/make_model.py, Adam, global batch 128, real Fashion-MNIST) as
1 rank x 1 thread, 1 rank x 2 threads and 2 ranks x 1 thread (`mpirun -np 2`).

Steps/s are measured without the start-up (loading, planning, the first step): each
configuration runs 20 and 20 + STEPS steps, and the rate is STEPS over the difference of the
two wall times; the median of --reps alternating repetitions. Bytes reduced per step come
from the run's metrics (`bytes_reduced`, rank 0's, float64 payload), and so does the time rank 0
spent in collectives per step (`collective_s`: the allreduce and any wait for the other rank),
from a separate 2-rank run of WARMUP steps.

It then prints the model of N machines of docs/distributed.md from these figures: a step on N
ranks takes t_1 / N (this machine's 1 x 1 step time, the batch split N ways: assumes compute
linear in the rows, optimistic for small shares) plus a ring allreduce of S bytes (the
measured bytes per step): 2 (N - 1) alpha + 2 (N - 1) / N * S / beta, for two networks:
10 Gb Ethernet (alpha 20 us, beta 1.25 GB/s) and 100 Gb InfiniBand (alpha 2 us, beta 12.5 GB/s).

Usage: .venv/bin/python bench/distributed.py [--reps 3] [--steps mlp=440,cnn=200]   (after scripts/build release)
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
ONNXTRAIN = os.path.join(ROOT, "build", "release", "src", "onnxtrain")
WORK = os.path.join(ROOT, "build", "bench-distributed")
DATA = "/usr/share/datasets/fashion-mnist"
BATCH = 128
WARMUP = 20
NETWORKS = {"10GbE": (20e-6, 1.25e9), "IB100": (2e-6, 12.5e9)}  # latency (s), bandwidth (bytes/s)


def timed_run(model, ranks, threads, steps, metrics=None):
    """Wall seconds of `onnxtrain train` for `steps` steps under mpirun -np ranks."""
    cmd = [ONNXTRAIN, "train", os.path.join(WORK, f"{model}_train.onnx"), "--data", DATA, "--scale", "image=1/255",
           "--batch-size", str(BATCH), "--epochs", "100", "--max-steps", str(steps), "--threads", str(threads), "--no-shuffle", "-q",
           "-o", os.path.join(WORK, f"{model}_out.onnx")]
    if metrics:
        cmd += ["--metrics", metrics]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if ranks > 1:
        cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"] + cmd
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    took = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(" ".join(cmd) + f" exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return took


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", default="mlp=440,cnn=200",
                        help="steps timed per model (MODEL=STEPS,...), at most 449 so that no epoch ends (469 batches of 128) inside the timed steps")
    parser.add_argument("--models", default="mlp,cnn")
    args = parser.parse_args()
    if not shutil.which("mpirun"):
        sys.exit("mpirun not found (apt-get install openmpi-bin)")
    os.makedirs(WORK, exist_ok=True)
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "fashion_mnist", "make_model.py"), WORK], check=True,
                   capture_output=True)
    configs = [(1, 1), (1, 2), (2, 1)]
    model_rows = []
    print(f"| model | ranks x threads | steps/s (median of {args.reps}) | vs 1 x 1 | bytes reduced per step "
          "| in collectives per step |")
    print("|---|---|---|---|---|---|")
    steps_of = dict(item.split("=") for item in args.steps.split(","))
    for model in args.models.split(","):
        steps = int(steps_of[model])
        subprocess.run([ONNXTRAIN, "make-trainable", os.path.join(WORK, f"{model}.onnx"), "-o",
                        os.path.join(WORK, f"{model}_train.onnx"), "--loss", "cross_entropy", "--optimizer", "adam",
                        "--lr", "1e-3"], check=True, capture_output=True)
        rates = {c: [] for c in configs}
        for _ in range(args.reps):
            for ranks, threads in configs:
                short = timed_run(model, ranks, threads, WARMUP)
                long = timed_run(model, ranks, threads, WARMUP + steps)
                rates[(ranks, threads)].append(steps / max(long - short, 1e-9))
        metrics = os.path.join(WORK, f"{model}_metrics.jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        timed_run(model, 2, 1, WARMUP, metrics)
        records = [r for r in map(json.loads, open(metrics)) if r["type"] == "step"]
        per_step = (records[-1]["bytes_reduced"] - records[0]["bytes_reduced"]) / (len(records) - 1)
        in_collectives = (records[-1]["collective_s"] - records[0]["collective_s"]) / (len(records) - 1)
        base = statistics.median(rates[(1, 1)])
        for ranks, threads in configs:
            rate = statistics.median(rates[(ranks, threads)])
            reduced = f"{per_step / 1e6:.2f} MB" if ranks > 1 else "-"
            waited = f"{in_collectives * 1e3:.2f} ms" if ranks > 1 else "-"
            print(f"| {model} | {ranks} x {threads} | {rate:.1f} | {rate / base:.2f}x | {reduced} | {waited} |",
                  flush=True)
        model_rows.append((model, 1 / base, per_step))
    print("\nModel of N machines (one rank each): step time in ms and speed-up over one machine")
    print("| model | network | " + " | ".join(f"N = {n}" for n in (2, 4, 8, 16, 32)) + " |")
    print("|---|---|" + "---|" * 5)
    for model, t1, size in model_rows:
        for network, (alpha, beta) in NETWORKS.items():
            cells = []
            for n in (2, 4, 8, 16, 32):
                t = t1 / n + 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / beta
                cells.append(f"{t * 1e3:.2f} ({t1 / t:.1f}x)")
            print(f"| {model} | {network} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
