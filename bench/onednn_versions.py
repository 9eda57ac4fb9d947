#!/usr/bin/env python3
"""oneDNN 2.6 (Debian's libdnnl, which onnxtrain links) against oneDNN 3.x (PyPI's onednn 2026.x)
on the sgemm shapes the workloads spend their GEMM time in, alternating, in one run.

oneDNN 3.x's C++ API differs from 2.6's (primitive descriptors without operation descriptors),
so onnxtrain itself builds against one of them; dnnl_sgemm's C API is the same in both, and
bench/bench_sgemm.cpp compiles against either. This script downloads the onednn, onednn-devel
wheels and the runtime wheels PyPI's build needs (tbb, intel-sycl-rt, intel-cmplr-lib-rt,
intel-cmplr-lib-ur) into build/onednn3 (once), compiles bench_sgemm.cpp against them, and
measures both builds. PyPI's oneDNN runs on TBB threads (its CPU runtime), Debian's on OpenMP.

Usage: .venv/bin/python bench/onednn_versions.py [--reps 3]   (after scripts/build release)
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
WHEELS = ["onednn==2026.1.0", "onednn-devel==2026.1.0", "tbb", "intel-sycl-rt", "intel-cmplr-lib-rt",
          "intel-cmplr-lib-ur"]
# (what, M, N, K): C[M, N] = A[M, K] B[K, N]
SHAPES = [
    ("peak, 2048^3", 2048, 2048, 2048),
    ("MLP fc1 forward", 128, 512, 784),
    ("MLP fc2 forward", 128, 512, 512),
    ("CNN fc1 forward", 128, 1024, 3136),
    ("BERT attention projections", 4096, 256, 256),
    ("BERT feed-forward up", 4096, 1024, 256),
    ("BERT feed-forward down", 4096, 256, 1024),
    ("LSTM input projection", 4096, 1024, 256),
    ("LSTM recurrent step", 64, 1024, 256),
]


def prepare():
    """The path of bench_sgemm built against oneDNN 3.x, and the library folders it needs."""
    exe = os.path.join(WORK, "bench_sgemm_v3")
    unpacked = os.path.join(WORK, "unpacked")
    if not os.path.exists(unpacked):
        os.makedirs(WORK, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", WORK] + WHEELS, check=True)
        for wheel in glob.glob(os.path.join(WORK, "*.whl")):
            zipfile.ZipFile(wheel).extractall(unpacked)
    libs = sorted({os.path.dirname(p) for p in glob.glob(os.path.join(unpacked, "*", "data", "lib", "*.so*"))})
    include = glob.glob(os.path.join(unpacked, "onednn_devel-*", "data", "include"))[0]
    dnnl = glob.glob(os.path.join(unpacked, "onednn-*", "data", "lib"))[0]
    if not os.path.exists(exe):
        subprocess.run(["g++", "-O2", "-std=c++20", "-fopenmp", "-I" + include, os.path.join(ROOT, "bench", "bench_sgemm.cpp"),
                        "-L" + dnnl, "-l:libdnnl.so.3", "-Wl,--allow-shlib-undefined", "-o", exe], check=True)
    return exe, libs


def gflops(exe, shape, env):
    out = subprocess.run([exe, "--m", str(shape[1]), "--n", str(shape[2]), "--k", str(shape[3]), "--threads", "2",
                          "--repeats", "50" if shape[1] * shape[2] * shape[3] < 1e9 else "10"],
                         capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out)["gflops"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    v3, libs = prepare()
    v2 = os.path.join(ROOT, "build", "release", "bench", "onnxtrain-bench-sgemm")
    env3 = dict(os.environ, LD_LIBRARY_PATH=":".join(libs))
    print("| shape | M x N x K | oneDNN 2.6 GFLOP/s | oneDNN 3.x GFLOP/s | 3.x / 2.6 |\n|---|---|---|---|---|")
    for shape in SHAPES:
        old, new = [], []
        for _ in range(args.reps):
            old.append(gflops(v2, shape, dict(os.environ)))
            new.append(gflops(v3, shape, env3))
        a, b = statistics.median(old), statistics.median(new)
        print(f"| {shape[0]} | {shape[1]} x {shape[2]} x {shape[3]} | {a:.0f} | {b:.0f} | {b / a:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
