#!/usr/bin/env python3
"""onnxtrain against PyTorch (training) and ONNX Runtime (inference) on the Fashion-MNIST models.

Training: the MLP (784-512-512-10) and the CNN of examples/fashion_mnist, Adam, batch 128, the
same Fashion-MNIST batches in memory, each implementation at 1 and 2 threads, runs alternating
between onnxtrain (`onnxtrain train`; at as many threads as CPUs through its default, without
--threads, and its wait policy: src/cli/wait_policy.h) and PyTorch 2.13 (bench/torch_train.py,
run with the Python that runs this script: the project's .venv). Each side leaves out the start-up and times
STEPS steps after WARMUP untimed ones in one process, as bench/workloads.py does: onnxtrain from
the per-step records of `onnxtrain train --metrics` (the loop's time at step k is k / steps_per_s),
PyTorch by its own clock. (Until 2026-11-25 both timed every step from the first, whose one-time
costs, the arena's page faults and oneDNN's JIT, took ~30 ms of the MLP's ~200 ms for 150 steps.)
Reports the median steps/s at each one's best thread count (a count whose first run is far behind
the other's is not timed again: bench/thread_counts.py), the ratio,
the peak resident memory (VmHWM) of each process, onnxtrain's achieved GFLOP/s as a
fraction of the oneDNN sgemm peak measured in the same run (and the median fraction of the peak
measured just before each of its runs: bench/peak_beside.py), and the share of onnxtrain's step
that oneDNN's own kernels at the model's shapes need when timed alone (bench/gemm_peak.py,
bench/conv_peak.py), and the step's ceiling: those kernels plus Adam's pass over the parameters
alone (bench/ceiling.py).
Inference: forward passes at batch 1 and 128, onnxtrain (bench/bench_infer.cpp) against
ONNX Runtime 1.30 (the onnxruntime wheel of the .venv, driven by bench/ort_infer.py).

Usage: .venv/bin/python bench/run_bench.py [--reps 3] [--steps 200] [--write-docs]
       (after scripts/build release; --write-docs replaces the fashion-mnist section of docs/performance.md)
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BUILD = os.path.join(ROOT, "build", "release")
ONNXTRAIN = os.path.join(BUILD, "src", "onnxtrain")
SGEMM = os.path.join(BUILD, "bench", "onnxtrain-bench-sgemm")
STREAM = os.path.join(BUILD, "bench", "onnxtrain-bench-stream")
WORK = os.path.join(ROOT, "build", "bench")
DATA = "/usr/share/datasets/fashion-mnist"
BATCH = 128
WARMUP = 10  # untimed steps on each side before the timed ones
# Timed inference runs per measurement (the median counts), each side: 200, or fewer where one
# run is long (the CNN at batch 128 takes 25-55 ms a run on the AVX2 VM, so 200 runs took 5-12 s
# in each of its 12 configurations: ~100 s of this script's ~390 there).
INFER_ITERS = {("cnn", 128): 40}
sys.path.insert(0, os.path.join(ROOT, "bench"))
import ceiling  # noqa: E402
import conv_peak  # noqa: E402
import gemm_peak  # noqa: E402
import peak_beside  # noqa: E402
from docs_section import machine, write_section  # noqa: E402
from thread_counts import contending, onnxtrain_threads, recorded_threads_error  # noqa: E402


def run_measured(cmd, env=None):
    """Runs cmd, returns (stdout, peak resident MiB) from polling /proc/PID/status VmHWM."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = 0
    while p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.02)
    out, err = p.communicate()
    if p.returncode != 0:
        raise RuntimeError(" ".join(cmd) + f" exited {p.returncode}:\n{out}{err}")
    return out, peak / 1024


def flops_per_step(model):
    """Multiply-adds x 2 of one training step on a batch of 128: the forward pass, the weight
    gradients (as many as the forward) and the input gradients of every layer but the first
    (the images need none)."""
    if model == "mlp":
        layers = [784 * 512, 512 * 512, 512 * 10]
        forward = [2 * BATCH * m for m in layers]
    else:
        forward = [2 * BATCH * 28 * 28 * 32 * 25, 2 * BATCH * 14 * 14 * 64 * 32 * 25,
                   2 * BATCH * 3136 * 1024, 2 * BATCH * 1024 * 10]
    return 2 * sum(forward) + sum(forward[1:])


def kernels_alone_ms(model, threads):
    """oneDNN's own kernels at the model's shapes, timed alone (warm, no reorders, no other op): its
    convolutions (bench/conv_peak.py) and matrix products (bench/gemm_peak.py), forward and backward,
    of one training step at batch BATCH; and the optimizer's pass over the model's parameters alone
    (bench/ceiling.py). Returns (kernels ms, pass ms)."""
    pass_ms = ceiling.optimizer_pass_ms(STREAM, os.path.join(WORK, f"{model}_train.onnx"), threads)[0]
    path = os.path.join(WORK, f"{model}.onnx")
    ms = gemm_peak.measure(os.path.join(BUILD, "bench", "onnxtrain-bench-gemm"),
                           gemm_peak.product_shapes(path, BATCH), threads)["total_ms"]
    convolutions = conv_peak.conv_shapes(path, BATCH)
    if convolutions:
        ms += conv_peak.measure(os.path.join(BUILD, "bench", "onnxtrain-bench-conv"), convolutions, threads)["total_ms"]
    return ms, pass_ms


def onnxtrain_train(model, threads, steps):
    """steps/s, peak MiB and step-arena MiB of `onnxtrain train` at `threads` (its default at as
    many threads as CPUs: thread_counts.onnxtrain_threads)."""
    metrics = os.path.join(WORK, f"metrics_{model}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    flags, env = onnxtrain_threads(threads)
    _, peak = run_measured([ONNXTRAIN, "train", os.path.join(WORK, f"{model}_train.onnx"), "--data", DATA,
                            "--scale", "image=1/255", "--batch-size", str(BATCH), "--max-steps", str(WARMUP + steps),
                            *flags, "--no-shuffle", "-q", "--metrics", metrics,
                            "-o", os.path.join(WORK, f"{model}_trained.onnx")], env=env)
    records = [r for r in map(json.loads, open(metrics)) if r["type"] == "step"]
    if len(records) != WARMUP + steps:
        raise RuntimeError(f"onnxtrain train ran {len(records)} steps, expected {WARMUP + steps}")
    error = recorded_threads_error(records, threads)
    if error:
        raise RuntimeError(error)
    # The k-th record's steps_per_s is k steps over the loop's seconds so far.
    seconds = [(k + 1) / r["steps_per_s"] for k, r in enumerate(records)]
    return steps / max(seconds[-1] - seconds[WARMUP - 1], 1e-9), peak, records[-1]["step_arena_bytes"] / 2**20


def torch_train(model, threads, steps):
    out, peak = run_measured([sys.executable, os.path.join(ROOT, "bench", "torch_train.py"), model,
                              os.path.join(WORK, f"{model}.onnx"), "--threads", str(threads), "--warmup", str(WARMUP),
                              "--steps", str(steps)])
    return json.loads(out.strip().splitlines()[-1])["steps_per_s"], peak, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", default="200",
                        help="timed training steps: one count for every model, or per model, e.g. mlp=150,cnn=40")
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--write-docs", action="store_true",
                        help="replace the <!-- fashion-mnist:begin --> section of docs/performance.md with the tables")
    args = parser.parse_args()
    models = args.models.split(",")
    if "=" in args.steps:
        steps = {k: int(v) for k, v in (item.split("=") for item in args.steps.split(","))}
        missing = [m for m in models if m not in steps]
        if missing:
            parser.error(f"--steps names no count for {', '.join(missing)}")
    else:
        steps = {m: int(args.steps) for m in models}
    started = time.perf_counter()
    load = os.getloadavg()[0]
    os.makedirs(WORK, exist_ok=True)
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "fashion_mnist", "make_model.py"), WORK],
                   check=True, stdout=subprocess.DEVNULL)
    for m in ("mlp", "cnn"):
        subprocess.run([ONNXTRAIN, "make-trainable", os.path.join(WORK, f"{m}.onnx"), "-o",
                        os.path.join(WORK, f"{m}_train.onnx"), "--loss", "cross_entropy", "--optimizer", "adam",
                        "--lr", "1e-3"], check=True, stdout=subprocess.DEVNULL)
    sgemm = max(peak_beside.sgemm_gflops(SGEMM, t, peak_beside.RUN_REPEATS) for t in (1, 2))
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    import torch
    lines = [f"{datetime.date.today()}, {machine()}, load average before the run {load:.2f}, "
             f"commit {commit}; PyTorch {torch.__version__}; `bench/run_bench.py --reps {args.reps} --steps "
             f"{args.steps}`; oneDNN sgemm peak (2048^3) {sgemm:.0f} GFLOP/s in this run.", "",
             f"Training (median steps/s of {' and '.join(f'{steps[m]} ({m})' for m in models)} steps after {WARMUP} "
             "untimed ones, at each side's best thread "
             "count; onnxtrain's GFLOP/s counts the forward, "
             "the weight gradients and the input gradients of every layer but the first; the last column is the "
             "time oneDNN's own kernels at the model's shapes need, its matrix products (bench/gemm_peak.py) and "
             "convolutions (bench/conv_peak.py) forward and backward, each timed alone, warm, the fastest of 10 "
             "runs, at onnxtrain's best thread count (the faster of two measurements, before and after the "
             "model's training runs), and its share of onnxtrain's step; the fraction of the peak "
             "beside each run is the median, over onnxtrain's runs at its best thread count, of each run's GFLOP/s "
             "over the sgemm peak measured just before it, bench/peak_beside.py; the ceiling is those kernels alone "
             "plus Adam's pass over the parameters alone (bench/ceiling.py: the fastest a pass reading the gradient "
             "and updating the weights and both moments runs, warm, at the same thread count, the faster of two "
             "measurements likewise), the fastest a step doing only those could be, with its GFLOP/s as a fraction of "
             "the run's sgemm peak and the kernels' share of it: a fraction below 75 % puts that target out of "
             "reach in the run):", ""]

    def emit(line):
        print(line, flush=True)
        lines.append(line)
    emit("| model | onnxtrain steps/s (threads) | PyTorch steps/s (threads) | ratio | peak RSS onnxtrain / PyTorch "
         "(onnxtrain's step arena) | "
         "onnxtrain GFLOP/s (of the run's peak; of the peak beside each run) | "
         "oneDNN's kernels alone, ms (of the step) | the optimizer's pass alone, ms | "
         "ceiling, ms (of the run's peak; the kernels' share) |")
    emit("|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        results = {("onnxtrain", t): [] for t in (1, 2)} | {("pytorch", t): [] for t in (1, 2)}
        beside = {t: [] for t in (1, 2)}  # onnxtrain's (steps/s, sgemm GFLOP/s just before the run)
        peaks = {"onnxtrain": 0.0, "pytorch": 0.0}
        arena = 0.0  # MiB: what onnxtrain's step plan holds for the values its kernels compute
        # The kernels' time alone, measured before the training runs and again after them at
        # onnxtrain's best thread count, the faster counting (as the sgemm peak): a measurement
        # that lands in one of the VM's slow minutes (the MLP's products alone at 3.61 ms against
        # 1.84-1.94, twice in ten runs) would otherwise put the step above its own yardstick.
        alone_before = {t: kernels_alone_ms(model, t) for t in (1, 2)}
        for rep in range(args.reps):
            for t in (1, 2):
                for impl, fn in (("onnxtrain", onnxtrain_train), ("pytorch", torch_train)):
                    if rep > 0 and not contending({k: results[(impl, k)][0] for k in (1, 2)}, t):
                        continue
                    sgemm_now = peak_beside.sgemm_gflops(SGEMM, 2) if impl == "onnxtrain" else None
                    rate, peak, step_arena = fn(model, t, steps[model])
                    results[(impl, t)].append(rate)
                    if sgemm_now:
                        beside[t].append((rate, sgemm_now))
                    peaks[impl] = max(peaks[impl], peak)
                    arena = max(arena, step_arena or 0.0)
        best = {}
        for impl in ("onnxtrain", "pytorch"):
            best[impl] = max(((statistics.median(results[(impl, t)]), t) for t in (1, 2)))
        gflops = best["onnxtrain"][0] * flops_per_step(model) / 1e9
        after = kernels_alone_ms(model, best["onnxtrain"][1])
        alone = min(alone_before[best["onnxtrain"][1]][0], after[0])
        pass_ms = min(alone_before[best["onnxtrain"][1]][1], after[1])
        matched = peak_beside.median_fraction(beside[best["onnxtrain"][1]], flops_per_step(model) / 1e9)
        emit(f"| {model} | {best['onnxtrain'][0]:.1f} ({best['onnxtrain'][1]}) | {best['pytorch'][0]:.1f} "
              f"({best['pytorch'][1]}) | {best['onnxtrain'][0] / best['pytorch'][0]:.2f} | "
              f"{peaks['onnxtrain']:.0f} / {peaks['pytorch']:.0f} MiB ({arena:.1f}) | "
              f"{gflops:.0f} ({gflops / sgemm:.0%}; {'-' if matched is None else f'{matched:.0%}'}) | "
              f"{alone:.3f} ({alone * best['onnxtrain'][0] / 1e3:.0%}) | {pass_ms:.3f} | "
              f"{ceiling.cell(alone, pass_ms, flops_per_step(model) / 1e9, sgemm, 3)} |")

    lines += ["", "Inference (the best of the runs at 1 and 2 threads, each side):", ""]
    emit("| model | batch | onnxtrain ms | ONNX Runtime ms | ratio (ORT / onnxtrain) |")
    emit("|---|---|---|---|---|")
    for model in args.models.split(","):
        for batch in (1, 128):
            mine, theirs = {1: [], 2: []}, {1: [], 2: []}
            iters = str(INFER_ITERS.get((model, batch), 200))
            for rep in range(args.reps):
                for t in (1, 2):
                    if rep == 0 or contending({k: mine[k][0] for k in (1, 2)}, t, higher_is_better=False):
                        mine[t].append(json.loads(subprocess.run(
                            [os.path.join(BUILD, "bench", "onnxtrain-bench-infer"), os.path.join(WORK, f"{model}.onnx"),
                             "--batch", str(batch), "--threads", str(t), "--iters", iters], capture_output=True,
                            text=True, check=True).stdout)["ms"])
                    if rep == 0 or contending({k: theirs[k][0] for k in (1, 2)}, t, higher_is_better=False):
                        theirs[t].append(json.loads(subprocess.run(
                            [sys.executable, os.path.join(ROOT, "bench", "ort_infer.py"),
                             os.path.join(WORK, f"{model}.onnx"), str(batch), str(t), iters], capture_output=True,
                            text=True, check=True).stdout)["ms"])
            a, b = min(mine[1] + mine[2]), min(theirs[1] + theirs[2])
            emit(f"| {model} | {batch} | {a:.3f} | {b:.3f} | {b / a:.2f} |")
    lines += ["", f"(the run took {time.perf_counter() - started:.0f} s)"]
    if args.write_docs:
        write_section("fashion-mnist", "## Fashion-MNIST MLP and CNN", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
