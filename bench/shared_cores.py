#!/usr/bin/env python3
"""Training speed when the cores are shared (issue 18, docs/performance.md "Shared cores"): the
Fashion-MNIST MLP and CNN (Adam, batch 128), `onnxtrain train` without --threads (its default:
one thread per CPU that other processes leave free, runtime/cpu_load.h, and GOMP_SPINCOUNT=30000,
which the command sets for itself then unless the user chose a policy: src/cli/wait_policy.h), at
1 thread and at 2 threads by --threads under the wait policy the command sets for a fixed count
(GOMP_SPINCOUNT=1000), libgomp's own default (GOMP_SPINCOUNT=300000: threads spin that
long at the end of a parallel region before sleeping) and OMP_WAIT_POLICY=passive (they sleep
at once), on an idle machine and with 1 and 2 other busy processes (a spinning Python loop
each).

Steps/s without start-up: each configuration runs WARMUP and WARMUP + steps steps and divides
steps by the difference of the wall times; the median of --reps, configurations alternating.

--spins 10000,30000 adds configurations at 2 threads with those GOMP_SPINCOUNT values (a sweep
between onnxtrain's 1000 and libgomp's 300000); --busy 0,1 limits the loads measured.

A second table times inference the same way: the CNN at batch 1, median ms of --infer-iters runs
in process (bench/bench_infer.cpp, a runtime::Session), without a thread count (its default:
each run follows the load, runtime/cpu_load.h) with GOMP_SPINCOUNT=30000, and at 1 and at 2 threads
with 1000: the policies the command and the Python package set for themselves.

Usage: .venv/bin/python bench/shared_cores.py [--reps 3] [--models mlp,cnn] [--spins N,...] [--busy 0,1,2]
           [--infer-iters 500] [--no-inference]
       (after scripts/build release)
"""
import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
ONNXTRAIN = os.path.join(ROOT, "build", "release", "src", "onnxtrain")
BENCH_INFER = os.path.join(ROOT, "build", "release", "bench", "onnxtrain-bench-infer")
INFER_CONFIGS = [("default (threads from the load)", 0), ("1 thread", 1), ("2 threads", 2)]
WORK = os.path.join(ROOT, "build", "bench-shared-cores")
DATA = "/usr/share/datasets/fashion-mnist"
WARMUP = 10
STEPS = {"mlp": 300, "cnn": 40}
CONFIGS = [("default (threads from the load)", None, {}), ("1 thread", 1, {}), ("2 threads, spin 1000", 2, {}),
           ("2 threads, libgomp's default (spin 300000)", 2, {"GOMP_SPINCOUNT": "300000"}),
           ("2 threads, passive", 2, {"OMP_WAIT_POLICY": "passive"})]


def spin():
    while True:
        pass


def timed(model, threads, env_extra, steps):
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.pop("OMP_NUM_THREADS", None)
    env.update(env_extra)
    cmd = [ONNXTRAIN, "train", os.path.join(WORK, f"{model}_train.onnx"), "--data", DATA, "--scale", "image=1/255",
           "--batch-size", "128", "--epochs", "100", "--max-steps", str(steps), "--no-shuffle", "-q",
           "-o", os.path.join(WORK, f"{model}_out.onnx")]
    if threads is not None:  # else onnxtrain's default
        env["OMP_NUM_THREADS"] = str(threads)
        cmd += ["--threads", str(threads)]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return time.perf_counter() - start


def infer_ms(model, threads, iters):
    """Median ms per run of `model` at batch 1 (onnxtrain-bench-infer; threads 0: its default)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    env["GOMP_SPINCOUNT"] = "30000" if threads == 0 else "1000"  # src/cli/wait_policy.h
    out = subprocess.run([BENCH_INFER, os.path.join(WORK, f"{model}.onnx"), "--batch", "1", "--iters", str(iters),
                          "--threads", str(threads)], check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])["ms"]


def repeated(busy, reps, runs):
    """{name: [its value at each repetition]} of `runs` ({name: callable}, alternating) while
    `busy` spinning processes run."""
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(busy)]
    for s in spinners:
        s.start()
    try:
        values = {name: [] for name in runs}
        for _ in range(reps):
            for name, run in runs.items():
                values[name].append(run())
        return values
    finally:
        for s in spinners:
            s.terminate()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--spins", default="", help="more GOMP_SPINCOUNT values to time at 2 threads, comma-separated")
    parser.add_argument("--busy", default="0,1,2", help="numbers of other busy processes, comma-separated")
    parser.add_argument("--infer-iters", type=int, default=500, help="inference runs per measurement")
    parser.add_argument("--no-inference", action="store_true", help="the training table only")
    args = parser.parse_args()
    configs = CONFIGS + [(f"2 threads, spin {n}", 2, {"GOMP_SPINCOUNT": n}) for n in args.spins.split(",") if n]
    os.makedirs(WORK, exist_ok=True)
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "fashion_mnist", "make_model.py"), WORK], check=True,
                   capture_output=True)
    print("| model | other busy processes | " + " | ".join(name for name, _, _ in configs) + " |")
    print("|---|---|" + "---|" * len(configs))
    for model in [m for m in args.models.split(",") if m]:
        subprocess.run([ONNXTRAIN, "make-trainable", os.path.join(WORK, f"{model}.onnx"), "-o",
                        os.path.join(WORK, f"{model}_train.onnx"), "--loss", "cross_entropy", "--optimizer", "adam",
                        "--lr", "1e-3"], check=True, capture_output=True)
        steps = STEPS[model]

        def rate(threads, extra):
            """steps/s, or None where the longer run took no longer than the shorter (a load this
            uneven cannot be timed by the difference)."""
            took = timed(model, threads, extra, WARMUP + steps) - timed(model, threads, extra, WARMUP)
            return steps / took if took > 0 else None

        def cell(values):
            timed_ = [v for v in values if v is not None]
            if not timed_:
                return "(too noisy to time)"
            note = "" if len(timed_) == len(values) else f" ({len(timed_)} of {len(values)} timed)"
            return f"{statistics.median(timed_):.1f}{note}"
        for busy in (int(b) for b in args.busy.split(",")):
            rates = repeated(busy, args.reps, {name: (lambda t=threads, e=extra: rate(t, e)) for name, threads, extra in configs})
            cells = [cell(rates[name]) for name, _, _ in configs]
            print(f"| {model} | {busy} | " + " | ".join(cells) + " |", flush=True)
    if args.no_inference:
        return
    print("\n| inference, batch 1 | other busy processes | " + " | ".join(name for name, _ in INFER_CONFIGS) + " |")
    print("|---|---|" + "---|" * len(INFER_CONFIGS))
    for busy in (int(b) for b in args.busy.split(",")):
        times = repeated(busy, args.reps,
                         {name: (lambda t=threads: infer_ms("cnn", t, args.infer_iters)) for name, threads in INFER_CONFIGS})
        cells = [f"{statistics.median(times[name]):.3f} ms" for name, _ in INFER_CONFIGS]
        print(f"| cnn | {busy} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
