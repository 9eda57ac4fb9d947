#!/usr/bin/env python3
"""oneDNN 2.6 (Debian's libdnnl, which onnxtrain links) against oneDNN 3.x (PyPI's onednn 2026.x)
at the workloads' shapes, alternating, in one run: the matrix product (dnnl_sgemm and the matmul
primitive), the LSTM primitive and the convolution primitives.

oneDNN 3.x's C++ API differs from 2.6's (primitive descriptors without operation descriptors);
bench/bench_primitives.cpp compiles against either. This script downloads PyPI's onednn and
onednn-devel wheels and the runtime wheels that build needs into build/onednn3 (once, ~400 MB):
PyPI's oneDNN 3.x runs its CPU primitives on SYCL, which needs a SYCL CPU device, here Intel's
OpenCL CPU runtime (intel-opencl-rt, found through OCL_ICD_FILENAMES), besides TBB and Intel's
SYCL and compiler runtimes. Without that runtime only dnnl_sgemm, which needs no engine, runs
("could not create an engine"). Debian's 2.6 runs on OpenMP threads (--threads 2), the SYCL
build on all the machine's cores (TBB).

Usage: .venv/bin/python bench/onednn_versions.py [--reps 3] [--only products,lstm,conv]
       (after scripts/build release; prints Markdown tables, medians of --reps, time in ms)
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import zipfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
WORK = os.path.join(ROOT, "build", "onednn3")
V2 = os.path.join(ROOT, "build", "release", "bench", "onnxtrain-bench-primitives")
SOURCE = os.path.join(ROOT, "bench", "bench_primitives.cpp")
SOURCES = [SOURCE, os.path.join(ROOT, "bench", "bench_common.h")]
WHEELS = ["onednn==2026.1.0", "onednn-devel==2026.1.0", "tbb==2023.2.0", "intel-sycl-rt==2026.2.0",
          "intel-cmplr-lib-rt==2026.2.0", "intel-cmplr-lib-ur==2026.2.0", "intel-opencl-rt==2026.2.0"]
# (what, M, N, K): C[M, N] = A[M, K] B[K, N]
PRODUCTS = [
    ("peak, 2048^3", 2048, 2048, 2048),
    ("MLP fc1 forward, batch 128", 128, 512, 784),
    ("MLP fc2 forward, batch 128", 128, 512, 512),
    ("CNN fc1 forward, batch 128", 128, 1024, 3136),
    ("BERT attention projection, batch 1", 128, 256, 256),
    ("BERT feed-forward up, batch 1", 128, 1024, 256),
    ("BERT feed-forward down, batch 1", 128, 256, 1024),
    ("BERT feed-forward up, batch 32", 4096, 1024, 256),
    ("LSTM recurrent step, batch 64", 64, 1024, 256),
    ("LSTM recurrent step, a thread's half of batch 64", 32, 1024, 256),
]
# (what, steps, batch, input, hidden): the LSTM workload's two layers at inference
LSTMS = [
    ("LSTM layer 1, batch 64", 64, 64, 32, 256),
    ("LSTM layer 2, batch 64", 64, 64, 256, 256),
    ("LSTM layer 2, batch 8", 64, 8, 256, 256),
]
# (what, batch, in channels, out channels, size, kernel, stride, training)
CONVS = [
    ("CNN conv1, inference batch 128", 128, 1, 32, 28, 5, 1, False),
    ("CNN conv2, inference batch 128", 128, 32, 64, 14, 5, 1, False),
    ("CNN conv2, training batch 128", 128, 32, 64, 14, 5, 1, True),
    ("ResNet-18 layer 1, training batch 32", 32, 64, 64, 32, 3, 1, True),
    ("ResNet-18 layer 3, training batch 32", 32, 256, 256, 8, 3, 1, True),
    ("ResNet-18 layer 4, training batch 32", 32, 512, 512, 4, 3, 1, True),
    ("ResNet-18 layer 1, inference batch 1", 1, 64, 64, 32, 3, 1, False),
    ("ResNet-18 layer 3, inference batch 128", 128, 256, 256, 8, 3, 1, False),
]


def prepare():
    """bench_primitives built against oneDNN 3.x, and the environment it runs in."""
    unpacked = os.path.join(WORK, "unpacked")
    if not os.path.exists(os.path.join(unpacked, "complete")):
        os.makedirs(WORK, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", WORK] + WHEELS, check=True)
        for wheel in glob.glob(os.path.join(WORK, "*.whl")):
            zipfile.ZipFile(wheel).extractall(unpacked)
        open(os.path.join(unpacked, "complete"), "w").close()
    data = lambda package: glob.glob(os.path.join(unpacked, f"{package}-*.data", "data"))[0]
    libs = sorted({os.path.dirname(p) for p in glob.glob(os.path.join(unpacked, "*", "data", "lib", "*.so*"))})
    exe = os.path.join(WORK, "bench_primitives_v3")
    if not os.path.exists(exe) or os.path.getmtime(exe) < max(map(os.path.getmtime, SOURCES)):
        subprocess.run(["g++", "-O2", "-std=c++20", "-fopenmp", "-I" + os.path.join(data("onednn_devel"), "include"),
                        SOURCE, "-L" + os.path.join(data("onednn"), "lib"), "-l:libdnnl.so.3",
                        "-Wl,--allow-shlib-undefined", "-o", exe], check=True)
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(libs),
               OCL_ICD_FILENAMES=os.path.join(data("intel_opencl_rt"), "lib", "libintelocl.so"))
    return exe, env


def measure(exe, args, env):
    done = subprocess.run([exe, "--threads", "2"] + args, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join([exe] + args)} exited {done.returncode}: {done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(reps, v3, env3, args, keys):
    """Medians over reps (2.6 and 3.x alternating) of each key, and the last run's other fields."""
    old, new = [], []
    for _ in range(reps):
        old.append(measure(V2, args, dict(os.environ)))
        new.append(measure(v3, args, env3))
    median = lambda runs, key: statistics.median(r[key] for r in runs)
    return {key: (median(old, key), median(new, key)) for key in keys}, old[-1], new[-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", default="products,lstm,conv")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    v3, env3 = prepare()
    if "products" in parts:
        print("| product | M x N x K | 2.6 sgemm | 2.6 matmul (implementation) | 3.x sgemm | 3.x matmul (implementation) "
              "| 3.x best / 2.6 best |\n|---|---|---|---|---|---|---|", flush=True)
        for what, m, n, k in PRODUCTS:
            t, old, new = compare(args.reps, v3, env3, ["product", "--m", str(m), "--n", str(n), "--k", str(k)],
                                  ["sgemm_ms", "matmul_ms"])
            gf = lambda ms: old["gflop"] / ms * 1e3
            best_old, best_new = min(t["sgemm_ms"][0], t["matmul_ms"][0]), min(t["sgemm_ms"][1], t["matmul_ms"][1])
            print(f"| {what} | {m} x {n} x {k} | {gf(t['sgemm_ms'][0]):.0f} | {gf(t['matmul_ms'][0]):.0f} "
                  f"({old['matmul_impl']}) | {gf(t['sgemm_ms'][1]):.0f} | {gf(t['matmul_ms'][1]):.0f} "
                  f"({new['matmul_impl']}) | {best_old / best_new:.2f} |", flush=True)
        print("\n(GFLOP/s)\n")
    if "lstm" in parts:
        print("| LSTM layer, forward_inference | steps x batch, input -> hidden | 2.6 ms (implementation) "
              "| 3.x ms (implementation) | 2.6 / 3.x |\n|---|---|---|---|---|", flush=True)
        for what, steps, batch, inputs, hidden in LSTMS:
            t, old, new = compare(args.reps, v3, env3, ["lstm", "--steps", str(steps), "--batch", str(batch), "--input",
                                                        str(inputs), "--hidden", str(hidden), "--repeats", "5"], ["ms"])
            print(f"| {what} | {steps} x {batch}, {inputs} -> {hidden} | {t['ms'][0]:.2f} ({old['impl']}) "
                  f"| {t['ms'][1]:.2f} ({new['impl']}) | {t['ms'][0] / t['ms'][1]:.2f} |", flush=True)
        print()
    if "conv" in parts:
        print("| convolution | N, C -> M, size, kernel / stride | primitive | 2.6 ms (implementation) "
              "| 3.x ms (implementation) | 2.6 / 3.x |\n|---|---|---|---|---|---|", flush=True)
        for what, n, c, m, size, kernel, stride, training in CONVS:
            keys = ["forward", "backward_data", "backward_weights"] if training else ["forward"]
            t, old, new = compare(args.reps, v3, env3,
                                  ["conv", "--batch", str(n), "--in-channels", str(c), "--out-channels", str(m), "--size",
                                   str(size), "--kernel", str(kernel), "--stride", str(stride), "--repeats", "5"]
                                  + (["--training"] if training else []), [key + "_ms" for key in keys])
            for key in keys:
                a, b = t[key + "_ms"]
                name = {"forward": "forward_training" if training else "forward_inference"}.get(key, key)
                print(f"| {what} | {n}, {c} -> {m}, {size}x{size}, {kernel}x{kernel} / {stride} | {name} "
                      f"| {a:.2f} ({old[key + '_impl']}) | {b:.2f} ({new[key + '_impl']}) | {a / b:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
