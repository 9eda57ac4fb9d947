#!/usr/bin/env python3
"""onnxtrain against PyTorch 2.13 and ONNX Runtime 1.30 on the workloads of issue 18 beyond the
Fashion-MNIST MLP and CNN (those stay in bench/run_bench.py): ResNet-18 (32x32, batch 32,
SGD-momentum), a BERT-style encoder from `transformers` (4 layers, hidden 256, sequence 128,
batch 32, AdamW) and a 2-layer LSTM classifier (hidden 256, sequence 64, batch 64, Adam), as
bench/workload_models.py defines them.

For each workload, in one run:
- export: torch.onnx.export (TorchScript exporter, opset 17) in training mode, then
  `onnxtrain make-trainable --loss cross_entropy` with the workload's optimizer; and in eval mode,
  the inference model. Synthetic data (one batch more than the timed run takes) is written to a .npz.
- training: `onnxtrain train` on the .npz (--no-shuffle; one epoch holds every timed step, so no
  epoch-end checkpoint lands inside the timing) against PyTorch eager (bench/workload_torch.py,
  the same module, optimizer and batches in memory), at each thread
  count of --threads (onnxtrain at as many threads as CPUs through its default, without --threads,
  and its wait policy: src/cli/wait_policy.h); each side's best (a count whose first repetition is far behind another's is
  not timed again, here and in inference: bench/thread_counts.py). Both leave out the start-up and time STEPS steps after
  WARMUP in one process: onnxtrain from the per-step records of `onnxtrain train --metrics`
  (steps_per_s there is the steps so far over the seconds since the training loop began, so the
  loop's time at step k is k / steps_per_s), PyTorch by its own clock. (Until 2026-11-25 onnxtrain's
  rate was STEPS over the difference of the wall times of a WARMUP- and a WARMUP + STEPS-step
  run; a slow start-up of the shorter run inflated it: BERT 5.82 steps/s in one run, 3.8-4.1 by
  hand.) Peak RSS is
  the largest VmHWM of /proc/PID/status polled every 20 ms.
- torch.compile (inductor) at PyTorch eager's best thread count, under --compile-timeout.
- the loss of step 1 on each side (the same initial weights and batch): a check that both compute
  the same function.
- inference: the eval-mode model at batch 1 and a large batch, onnxtrain (onnxtrain-bench-infer,
  in process; BERT's int64 token ids uniform in its vocabulary) against ONNX Runtime
  (bench/workload_infer.py), the two alternating run by run; best thread count of each. (BERT's
  onnxtrain side ran through the Python binding until 2026-11-28, in a process that had imported
  torch: its first product of each run took 1.08 ms there against 0.20-0.31 in process.)
- each workload against oneDNN's own kernels at its shapes, timed alone, for the training step and
  inference: the convolution-bound one (ResNet-18) against its convolutions (bench/conv_peak.py,
  bench/bench_conv.cpp), the GEMM-bound ones (BERT, the LSTM) against their matrix products
  (bench/gemm_peak.py, bench/bench_gemm.cpp), and each training step's ceiling: those kernels plus
  its optimizer's pass alone (bench/ceiling.py, bench/bench_stream.cpp).
A step that fails is reported in the tables with its error message, and the run goes on.

Usage: .venv/bin/python bench/workloads.py [--workloads resnet18,bert,lstm] [--threads 1,2]
           [--reps 1] [--steps resnet18=10,bert=3,lstm=3] [--write-docs]
       (after scripts/build release; --build names another build folder)
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BENCH = os.path.join(ROOT, "bench")
WORK = os.path.join(ROOT, "build", "bench-workloads")
SECTION = "workloads"
SECTION_TITLE = "## Workloads: ResNet-18, BERT encoder, LSTM"
sys.path.insert(0, BENCH)
import ceiling  # noqa: E402
import conv_peak  # noqa: E402
import gemm_peak  # noqa: E402
import peak_beside  # noqa: E402
import workload_models  # noqa: E402
from docs_section import machine, write_section  # noqa: E402
from thread_counts import contending, onnxtrain_threads, recorded_threads_error  # noqa: E402

# Step 2 is the first on the memory plan's fresh arena (page faults); BERT's third step was
# still slow in some runs on the Zen 4 VM of 2026-11-29 (887 ms against ~500 from the fourth on).
WARMUP = {"resnet18": 2, "bert": 3, "lstm": 2}
STEPS = {"resnet18": 10, "bert": 3, "lstm": 3}
INFER_BATCHES = {"resnet18": (1, 128), "bert": (1, 32), "lstm": (1, 64)}
INFER_ITERS = {"resnet18": 20, "bert": 5, "lstm": 10}  # Python-timed runs; bench-infer takes --iters too
# Measured against oneDNN's own kernels at their shapes too (alone_section): the convolutions, or
# the matrix products.
CONV_BOUND = ("resnet18",)
GEMM_BOUND = ("bert", "lstm")


class Failed(Exception):
    """A command that exited non-zero or ran out of time; str() is its error message."""


def error_line(text):
    """The line of a failed command's output that says why: the last one naming an error, else the last."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    named = [line for line in lines if "error" in line.lower() or "what()" in line]
    return ((named or lines or ["(no output)"])[-1])[:400]


def measured(cmd, timeout, env=None):
    """Runs cmd; returns (stdout, wall seconds, peak resident MiB). Raises Failed with the error."""
    start = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=BENCH)
    peak_kib = 0
    while p.poll() is None:
        if time.perf_counter() - start > timeout:
            p.kill()
            p.communicate()
            raise Failed(f"timed out after {timeout:.0f} s")
        try:
            with open(f"/proc/{p.pid}/status") as status:
                hwm = [line for line in status if line.startswith("VmHWM:")]
            if hwm:
                peak_kib = max(peak_kib, int(hwm[0].split()[1]))
        except OSError:
            pass
        time.sleep(0.02)
    wall = time.perf_counter() - start
    out, err = p.communicate()
    if p.returncode != 0:
        raise Failed(error_line(err + "\n" + out) + f" (exit {p.returncode})")
    return out, wall, peak_kib / 1024


def last_json(out):
    return json.loads(out.strip().splitlines()[-1])


def prepare(name, tools, errors, batches):
    """Exports, make-trainable and the .npz. Returns the paths, or None (errors[name] says why)."""
    paths = {k: os.path.join(WORK, f"{name}{suffix}") for k, suffix in
             (("train_export", ".onnx"), ("infer", "_infer.onnx"), ("trainable", "_train.onnx"), ("data", ".npz"))}
    try:
        workload_models.export(name, paths["train_export"], training=True)
        workload_models.export(name, paths["infer"], training=False)
    except Exception as e:  # the exporter's own message is the finding
        errors[(name, "export")] = f"{type(e).__name__}: {e}"[:400]
        return None
    np.savez(paths["data"], **workload_models.dataset(name, batches))
    try:
        measured([tools["onnxtrain"], "make-trainable", paths["train_export"], "-o", paths["trainable"],
                  "--loss", "cross_entropy"] + workload_models.OPTIMIZER[name][0], 300)
    except Failed as e:
        errors[(name, "make-trainable")] = str(e)
        paths["trainable"] = None
    # The exports as onnxtrain computes them (bench/bench_rows.cpp: the Gathers that
    # runtime/fusion.h gather_before_rowwise_ops moves, moved): BERT's pooler reads token 0, so the
    # last layer's query-side products run on one row of each sequence. bench/gemm_peak.py reads
    # these, so that the products timed alone and onnxtrain's GFLOP are the ones it runs.
    for key in ("train_export", "infer"):
        rows = paths[key][:-len(".onnx")] + "_rows.onnx"
        try:
            out, _, _ = measured([tools["bench_rows"], paths[key], rows], 300)
            paths[key + "_rows"] = rows if last_json(out)["moved"] else paths[key]
        except Failed as e:
            errors[(name, f"{key} with the Gathers moved")] = str(e)
            paths[key + "_rows"] = paths[key]
    return paths


def product_flops(model, batch):
    """FLOPs (2 per multiply-add) of the matrix products bench/gemm_peak.py lists for a training step."""
    return sum(2 * p["m"] * p["n"] * p["k"] * p["batch"] * p["count"]
               for p in gemm_peak.product_shapes(model, batch, inference=False))


def onnxtrain_flops(name, paths, flops):
    """flops (train_flops) less the products onnxtrain does not run (gather_before_rowwise_ops; the
    difference between the export's products and those of the export with the Gathers moved)."""
    if not paths or paths["train_export_rows"] == paths["train_export"]:
        return flops
    batch = workload_models.BATCH[name]
    return flops - (product_flops(paths["train_export"], batch) - product_flops(paths["train_export_rows"], batch))


def onnxtrain_rate(name, paths, tools, threads, steps, timeout):
    """(steps/s of the `steps` steps after WARMUP, peak MiB of the run, loss of step 1, MiB of the step's
    memory-plan arena: step_arena_bytes of the metrics)."""
    metrics = os.path.join(WORK, f"{name}_metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    flags, env = onnxtrain_threads(threads)  # the default at as many threads as CPUs
    _, _, peak = measured([tools["onnxtrain"], "train", paths["trainable"], "--data", paths["data"], "--batch-size",
                           str(workload_models.BATCH[name]), "--epochs", "1", "--max-steps",
                           str(WARMUP[name] + steps), "--no-shuffle", *flags,
                           "-q", "-o", os.path.join(WORK, f"{name}_trained.onnx"), "--metrics", metrics],
                          timeout, env=env)
    records = [r for r in map(json.loads, open(metrics)) if r["type"] == "step"]
    if len(records) != WARMUP[name] + steps:
        raise Failed(f"onnxtrain train ran {len(records)} steps, expected {WARMUP[name] + steps}")
    error = recorded_threads_error(records, threads)
    if error:
        raise Failed(error)
    # The k-th record's steps_per_s is k steps over the loop's seconds so far.
    seconds = [(k + 1) / r["steps_per_s"] for k, r in enumerate(records)]
    return (steps / max(seconds[-1] - seconds[WARMUP[name] - 1], 1e-9), peak, records[0]["loss"],
            records[-1]["step_arena_bytes"] / 2**20)


def torch_rate(name, threads, steps, timeout, compile_=False):
    cmd = [sys.executable, os.path.join(BENCH, "workload_torch.py"), name, "--threads", str(threads),
           "--warmup", str(WARMUP[name]), "--steps", str(steps),
           "--batches", str(WARMUP[name] + steps + 1)]  # the .npz's batches: the same samples and labels + (["--compile"] if compile_ else [])
    out, _, peak = measured(cmd, timeout, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    result = last_json(out)
    return result["steps_per_s"], peak, result["first_loss"]


def best(samples):
    """{threads: [rates]} -> (median rate, threads) of the best thread count, or None."""
    medians = [(statistics.median(r), t) for t, r in samples.items() if r]
    return max(medians) if medians else None


def train_section(names, prepared, tools, args, errors):
    """The training table. The sgemm peak is measured again after the training runs and the larger
    of the two measurements kept in args.sgemm: on a shared VM one measurement can land in a slow
    phase (87 against 132 GFLOP/s in the same run on 2026-11-28), which would overstate every
    fraction of it."""
    results = []
    for name in names:
        paths = prepared.get(name)
        mine, theirs, peaks = {t: [] for t in args.threads}, {t: [] for t in args.threads}, {"o": 0.0, "p": 0.0}
        beside = {t: [] for t in args.threads}  # onnxtrain's (steps/s, sgemm GFLOP/s just before the run)
        arena = 0.0
        first_loss = {}
        began = time.perf_counter()
        for rep in range(args.reps):
            for t in args.threads:
                first_mine = {k: v[0] for k, v in mine.items() if v}
                first_theirs = {k: v[0] for k, v in theirs.items() if v}
                if (paths and paths["trainable"] and (name, "train") not in errors
                        and (rep == 0 or contending(first_mine, t))):
                    try:
                        sgemm_now = peak_beside.sgemm_gflops(tools["bench_sgemm"], max(args.threads))
                        rate, peak, first_loss["o"], step_arena = onnxtrain_rate(name, paths, tools, t,
                                                                                 args.steps[name], args.timeout)
                        arena = max(arena, step_arena)
                        mine[t].append(rate)
                        beside[t].append((rate, sgemm_now))
                        peaks["o"] = max(peaks["o"], peak)
                    except Failed as e:
                        errors[(name, "train")] = f"--threads {t}: {e}"
                if (name, "torch") not in errors and (rep == 0 or contending(first_theirs, t)):
                    try:
                        rate, peak, first_loss["p"] = torch_rate(name, t, args.steps[name], args.timeout)
                        theirs[t].append(rate)
                        peaks["p"] = max(peaks["p"], peak)
                    except Failed as e:
                        errors[(name, "torch")] = f"--threads {t}: {e}"
        o, p = best(mine), best(theirs)
        args.best_train[name] = o
        compiled = "not tried (--no-compile)"
        eager_s = time.perf_counter() - began
        if not args.no_compile and p:
            try:
                rate, _, _ = torch_rate(name, p[1], args.steps[name], args.compile_timeout, compile_=True)
                compiled = f"{rate:.2f} ({p[1]})"
            except Failed as e:
                compiled = f"did not run: {e}"
        fmt = lambda r, key: f"{r[0]:.2f} ({r[1]})" if r else "failed: " + errors.get((name, key), "see below")
        ratio = f"{o[0] / p[0]:.2f}" if o and p else "-"
        rss = f"{peaks['o']:.0f} / {peaks['p']:.0f} MiB ({arena:.0f})" if o and p else "-"
        losses = " / ".join(f"{first_loss[k]:.4f}" if k in first_loss else "-" for k in ("o", "p"))
        matched = peak_beside.median_fraction(beside[o[1]], args.onnxtrain_flops[name] / 1e9) if o else None
        head = f"| {name} | {fmt(o, 'train')} | {fmt(p, 'torch')} | {ratio} | {compiled} | {rss} | "
        results.append((name, o, p, matched, head, f" | {losses} |"))
        print(results[-1][4] + f"... ({eager_s:.0f} s, torch.compile {time.perf_counter() - began - eager_s:.0f} s)",
              file=sys.stderr, flush=True)
    args.sgemm = max(args.sgemm, sgemm_peak(tools, args.threads))
    rows = []
    for name, o, p, matched, head, tail in results:
        mine, theirs = args.onnxtrain_flops[name] / 1e9, args.flops[name] / 1e9
        gflop = f"{theirs:.1f}" if mine == theirs else f"{mine:.1f} / {theirs:.1f}"
        roofline = (f"{gflop}: {o[0] * mine:.0f} ({o[0] * mine / args.sgemm:.0%}; {matched:.0%}) / "
                    f"{p[0] * theirs:.0f} ({p[0] * theirs / args.sgemm:.0%})") if o and p and matched else "-"
        rows.append(head + roofline + tail)
    return ["| workload | onnxtrain steps/s (threads) | PyTorch eager steps/s (threads) | ratio (onnxtrain / eager) "
            "| torch.compile steps/s (threads) | peak RSS onnxtrain / PyTorch eager (onnxtrain's step arena) "
            "| GFLOP per step (onnxtrain's / PyTorch's where they differ): GFLOP/s "
            "(of the sgemm peak; onnxtrain's of the peak beside each of its runs) onnxtrain / PyTorch eager "
            "| step-1 loss onnxtrain / PyTorch |",
            "|---|---|---|---|---|---|---|---|"] + rows


def infer_ms(engine, name, path, batch, threads, tools, timeout):
    iters = INFER_ITERS[name] if batch > 1 else 50
    if engine == "onnxtrain":
        ids = ["--int-high", str(workload_models.VOCAB)] if name == "bert" else []
        out, _, _ = measured([tools["bench_infer"], path, "--batch", str(batch), "--threads", str(threads),
                              "--iters", str(iters)] + ids, timeout)
    else:
        out, _, _ = measured([sys.executable, os.path.join(BENCH, "workload_infer.py"), path, name,
                              str(batch), str(threads), str(iters)], timeout)
    return last_json(out)["ms"]


def infer_section(names, prepared, tools, args, errors):
    rows = []
    for name in names:
        if not prepared.get(name):
            continue
        for batch in INFER_BATCHES[name]:
            # The two engines alternate run by run, so a change of the machine's speed between
            # minutes (this VM has a fast and a slow mode) reaches both alike.
            engines = ("onnxtrain", "ort")
            timings = {engine: [] for engine in engines}
            first = {engine: {} for engine in engines}  # thread count -> its first ms
            for rep in range(args.reps):
                for t in args.threads:
                    for engine in engines:
                        key = (name, f"infer-{engine}-{batch}")
                        if key in errors or (rep > 0 and not contending(first[engine], t, higher_is_better=False)):
                            continue
                        try:
                            timings[engine].append((infer_ms(engine, name, prepared[name]["infer"], batch, t, tools,
                                                             args.timeout), t))
                            first[engine].setdefault(t, timings[engine][-1][0])
                        except Failed as e:
                            errors[key] = f"--threads {t}: {e}"
            cells = [min(timings[engine]) if timings[engine] else None for engine in engines]
            args.best_infer[(name, batch)] = cells
            fmt = lambda c, e: f"{c[0]:.3f} ({c[1]})" if c else "failed: " + errors[(name, f"infer-{e}-{batch}")]
            ratio = f"{cells[1][0] / cells[0][0]:.2f}" if all(cells) else "-"
            rows.append(f"| {name} | {batch} | {fmt(cells[0], 'onnxtrain')} | {fmt(cells[1], 'ort')} | {ratio} |")
            print(rows[-1], file=sys.stderr, flush=True)
    return ["| workload | batch | onnxtrain ms (threads) | ONNX Runtime ms (threads) | ratio (ORT / onnxtrain) |",
            "|---|---|---|---|---|"] + rows


def kernels_alone(name, model, batch, tools, threads, inference):
    """(number of kernels, ms) of the workload's convolutions or matrix products timed alone."""
    if name in CONV_BOUND:
        shapes = conv_peak.conv_shapes(model, batch)
        return len(shapes), conv_peak.measure(tools["bench_conv"], shapes, threads, inference=inference)["total_ms"]
    products = gemm_peak.product_shapes(model, batch, inference=inference)
    return len(products), gemm_peak.measure(tools["bench_gemm"], products, threads)["total_ms"]


def alone_before(names, prepared, tools, args, errors):
    """The kernels alone_section times, measured once before the training runs at the largest thread
    count: {(name, "train" or an inference batch): ms}. alone_section takes the faster of this and its
    own measurement, as the sgemm peak is the larger of two (a measurement in one of the VM's slow
    minutes, where a vCPU runs at a fraction of its speed, would otherwise set the yardstick)."""
    threads, before = max(args.threads), {}
    for name in (n for n in names if (n in CONV_BOUND or n in GEMM_BOUND) and prepared.get(n)):
        try:
            before[(name, "train")] = kernels_alone(name, prepared[name]["train_export_rows"], workload_models.BATCH[name],
                                                    tools, threads, inference=False)[1]
            if prepared[name]["trainable"]:
                before[(name, "optimizer")] = ceiling.optimizer_pass_ms(tools["bench_stream"],
                                                                        prepared[name]["trainable"], threads)[0]
            for batch in INFER_BATCHES[name]:
                before[(name, batch)] = kernels_alone(name, prepared[name]["infer_rows"], batch, tools, threads,
                                                      inference=True)[1]
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
            errors[(name, "kernels alone, before the runs")] = str(e)[:400]
    return threads, before


def alone_section(names, prepared, tools, args, errors):
    """Each workload against oneDNN's own kernels at its shapes, timed alone: the yardstick issue 18
    names beside the sgemm peak. The convolution-bound workloads (bench/conv_peak.py): every Conv's
    forward, backward-data (not the first one's) and backward-weights primitives at batch BATCH;
    inference: forward_inference at each INFER_BATCHES size. The GEMM-bound ones
    (bench/gemm_peak.py): every matrix product of the step, forward and backward (inference: the
    forward ones). Each at the thread count that was onnxtrain's best; at the largest thread count,
    the faster of this measurement and alone_before's."""
    before_threads, before = args.alone_before

    def faster(key, threads, ms):
        return min(ms, before.get(key, ms)) if threads == before_threads else ms
    rows = []
    for name in (n for n in names if (n in CONV_BOUND or n in GEMM_BOUND) and prepared.get(n)):
        kind = "convolutions" if name in CONV_BOUND else "matrix products"
        try:
            o = args.best_train.get(name)
            if o:
                count, alone = kernels_alone(name, prepared[name]["train_export_rows"], workload_models.BATCH[name], tools,
                                             o[1], inference=False)
                alone = faster((name, "train"), o[1], alone)
                step = 1e3 / o[0]
                pass_ms = faster((name, "optimizer"), o[1], ceiling.optimizer_pass_ms(
                    tools["bench_stream"], prepared[name]["trainable"], o[1])[0])
                bound = ceiling.cell(alone, pass_ms, args.onnxtrain_flops[name] / 1e9, args.sgemm)
                rows.append(f"| {name} | training step, batch {workload_models.BATCH[name]} | {count} {kind} | "
                            f"{alone:.2f} ({o[1]}) | {step:.2f} | {alone / step:.0%} | {pass_ms:.2f} | {bound} | - |")
                print(rows[-1], file=sys.stderr, flush=True)
            for batch in INFER_BATCHES[name]:
                cells = args.best_infer.get((name, batch))
                if not cells or not cells[0]:
                    continue
                count, alone = kernels_alone(name, prepared[name]["infer_rows"], batch, tools, cells[0][1], inference=True)
                alone = faster((name, batch), cells[0][1], alone)
                ort = f"{cells[1][0]:.3f}" if cells[1] else "-"
                rows.append(f"| {name} | inference, batch {batch} | {count} {kind} | {alone:.3f} ({cells[0][1]}) | "
                            f"{cells[0][0]:.3f} | {alone / cells[0][0]:.0%} | - | - | {ort} |")
                print(rows[-1], file=sys.stderr, flush=True)
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
            errors[(name, f"{kind} alone")] = str(e)[:400]
    return ["| workload | what | kernels | oneDNN's kernels alone, ms (threads) | onnxtrain ms | "
            "fraction (alone / onnxtrain) | the optimizer's pass alone, ms | ceiling, ms (of the sgemm peak; the "
            "kernels' share) | ONNX Runtime ms |", "|---|---|---|---|---|---|---|---|---|"] + rows


def sgemm_peak(tools, threads):
    """GFLOP/s of oneDNN's sgemm at 2048^3, the best of the thread counts."""
    return max(peak_beside.sgemm_gflops(tools["bench_sgemm"], t, peak_beside.RUN_REPEATS) for t in threads)


def find_tools(build):
    """The executables of a build folder (build/release, else build-main/release)."""
    candidates = [build] if build else [os.path.join(ROOT, "build", "release"), os.path.join(ROOT, "build-main", "release")]
    for folder in candidates:
        if os.path.exists(os.path.join(folder, "src", "onnxtrain")):
            return {"onnxtrain": os.path.join(folder, "src", "onnxtrain"),
                    "bench_infer": os.path.join(folder, "bench", "onnxtrain-bench-infer"),
                    "bench_sgemm": os.path.join(folder, "bench", "onnxtrain-bench-sgemm"),
                    "bench_conv": os.path.join(folder, "bench", "onnxtrain-bench-conv"),
                    "bench_gemm": os.path.join(folder, "bench", "onnxtrain-bench-gemm"),
                    "bench_rows": os.path.join(folder, "bench", "onnxtrain-bench-rows"),
                    "bench_stream": os.path.join(folder, "bench", "onnxtrain-bench-stream")}
    sys.exit(f"no onnxtrain executable under {' or '.join(candidates)}: run scripts/build release (or pass --build)")


def header(args):
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    import onnxruntime
    import torch
    import transformers
    return (f"{datetime.date.today()}, {machine()}, load average before the run "
            f"{os.getloadavg()[0]:.2f}, commit {commit}; PyTorch {torch.__version__}, transformers "
            f"{transformers.__version__}, ONNX Runtime {onnxruntime.__version__}, Python {platform.python_version()}; "
            f"`bench/workloads.py --reps {args.reps} --threads {','.join(map(str, args.threads))} --steps "
            + ",".join(f"{k}={v}" for k, v in args.steps.items()) + "`")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="resnet18,bert,lstm")
    parser.add_argument("--threads", default="1,2", help="thread counts tried on each side, comma-separated")
    parser.add_argument("--reps", type=int, default=1, help="alternating repetitions; the median is reported")
    parser.add_argument("--steps", default="", help="timed training steps per workload, e.g. resnet18=10,bert=3")
    parser.add_argument("--timeout", type=float, default=300, help="seconds any one command may take")
    parser.add_argument("--compile-timeout", type=float, default=150, help="seconds a torch.compile run may take")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--build", help="build folder holding src/onnxtrain (default build/release)")
    parser.add_argument("--write-docs", action="store_true",
                        help=f"replace the <!-- {SECTION}:begin --> section of docs/performance.md with the tables")
    args = parser.parse_args()
    args.threads = [int(t) for t in args.threads.split(",")]
    args.steps = dict(STEPS, **{k: int(v) for k, v in (item.split("=") for item in args.steps.split(",") if item)})
    names = args.workloads.split(",")
    unknown = [n for n in names if n not in STEPS]
    if unknown:
        sys.exit(f"--workloads: unknown {', '.join(unknown)} (known: {', '.join(STEPS)})")
    tools = find_tools(args.build)
    os.makedirs(WORK, exist_ok=True)
    started = time.perf_counter()
    errors = {}
    lines = [header(args), ""]
    progress = lambda what: print(f"({what}: {time.perf_counter() - started:.0f} s since the start)", file=sys.stderr,
                                  flush=True)
    prepared = {name: prepare(name, tools, errors, WARMUP[name] + args.steps[name] + 1) for name in names}
    args.flops = {name: workload_models.train_flops(name) for name in names}
    args.onnxtrain_flops = {name: onnxtrain_flops(name, prepared[name], args.flops[name]) for name in names}
    args.sgemm = sgemm_peak(tools, args.threads)
    args.alone_before = alone_before(names, prepared, tools, args, errors)
    progress("exports, make-trainable, the sgemm peak and the kernels alone done")
    args.best_train, args.best_infer = {}, {}
    table = train_section(names, prepared, tools, args, errors)
    lines += [f"Training (steps/s without start-up; best thread count of each side). The machine's peak: oneDNN's "
              f"sgemm (2048^3, bench/bench_sgemm.cpp) at {args.sgemm:.0f} GFLOP/s in this run (the larger of two "
              "measurements, before and after the training runs); GFLOP per step counts the matrix products and "
              "convolutions of the forward and backward passes (bench/workload_models.py train_flops; onnxtrain's "
              "less the products it does not run: where a Gather reads a few positions, runtime/fusion.h "
              "gather_before_rowwise_ops computes only those, bench/workloads.py onnxtrain_flops); the second "
              "fraction of onnxtrain's is the median, over its runs at its best thread count, of each run's GFLOP/s "
              "over the sgemm peak measured just before it (bench/peak_beside.py).", ""]
    lines += table
    progress("training done")
    lines += ["", "Inference (median ms per run of the eval-mode export; best thread count of each):", ""]
    lines += infer_section(names, prepared, tools, args, errors)
    progress("inference done")
    lines += ["", "Each workload against oneDNN's own kernels at its shapes, timed alone, the fastest of 10 runs with "
              "warm operands, no reorders, no other op: the convolution-bound one's convolutions (bench/conv_peak.py: "
              "each Conv's forward, backward-data and backward-weights primitives, or forward_inference, in the "
              "memory formats oneDNN prefers), the GEMM-bound ones' matrix products (bench/gemm_peak.py: each "
              "product of the step's forward and backward passes, or of the forward pass, read from the ONNX "
              "export with the Gathers onnxtrain moves moved (bench/bench_rows.cpp), by dnnl_sgemm and by oneDNN's matmul primitive, the faster); at the largest thread count the "
              "faster of two measurements, before and after the training and inference runs. The fraction is the "
              "share of onnxtrain's time that these kernels alone need. The ceiling of a training step is those "
              "kernels alone plus its optimizer's pass over the parameters alone (bench/ceiling.py: the fastest a "
              "pass reading the gradient and updating the weights and the optimizer's state runs, warm, at the same "
              "thread count, the faster of two measurements likewise), the fastest a step doing only those could "
              "be, with its GFLOP/s as a fraction of the run's sgemm peak and the kernels' share of it: a fraction "
              "below 75 % puts that target out of reach in the run.", ""]
    lines += alone_section(names, prepared, tools, args, errors)
    lines += ["", "Errors (exact messages):", ""]
    lines += [f"- {name}, {stage}: `{message}`" for (name, stage), message in errors.items()] or ["- none"]
    lines += ["", f"(the run took {time.perf_counter() - started:.0f} s)"]
    text = "\n".join(lines)
    print(text)
    if args.write_docs:
        write_section(SECTION, SECTION_TITLE, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
