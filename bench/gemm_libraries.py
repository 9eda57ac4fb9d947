#!/usr/bin/env python3
"""The float32 matrix product in the three libraries at hand, at the shapes where ONNX Runtime's
inference is ahead of onnxtrain's and at the BERT encoder's training products (where PyTorch's MKL
is the peer, and the step is bound by them): oneDNN 2.6's sgemm (Debian's libdnnl, which onnxtrain runs every
GEMM through; bench/bench_sgemm.cpp), ONNX Runtime 1.30's MLAS (a model of MatMul nodes whose B is
an initializer, which ONNX Runtime packs once when it loads the model, as it does a workload's
weights) and MKL (PyTorch 2.13's CPU build, torch.mm with B transposed, as nn.Linear runs it).

Each side runs its products back to back for about half a second in one process and reports its
fastest call, as bench_sgemm does: bench_sgemm one dnnl_sgemm per call, the MLAS model 8 MatMul
nodes of the same A and B per session run (so that a run's fixed cost is spread over 8 products),
torch.mm one product per call. The three alternate shape by shape; medians of --reps.

Usage: .venv/bin/python bench/gemm_libraries.py [--reps 3] [--threads 1,2]   (after scripts/build release)
Prints a Markdown table of GFLOP/s.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SGEMM = os.path.join(ROOT, "build", "release", "bench", "onnxtrain-bench-sgemm")
NODES = 8  # MatMul nodes per ONNX Runtime session run
# (what, M, N, K): C[M, N] = A[M, K] B[K, N]
SHAPES = [
    ("peak, 2048^3", 2048, 2048, 2048),
    ("LSTM recurrent step, batch 64", 64, 1024, 256),
    ("LSTM recurrent step, a thread's half of batch 64", 32, 1024, 256),
    ("LSTM input projection, batch 64", 4096, 1024, 256),
    ("CNN fc1, batch 128", 128, 1024, 3136),
    ("BERT attention projection, batch 32", 4096, 256, 256),
    ("BERT feed-forward up, batch 32", 4096, 1024, 256),
    ("BERT feed-forward down, batch 32", 4096, 256, 1024),
]

# Timed in a child process so that each library sets its own thread pool from a clean start.
CHILD = r"""
import json, sys, time
import numpy as np
side, m, n, k, threads, seconds = sys.argv[1], *map(int, sys.argv[2:6]), float(sys.argv[6])
rng = np.random.default_rng(0)
a = rng.standard_normal((m, k), dtype=np.float32)
b = rng.standard_normal((k, n), dtype=np.float32)
if side == "mlas":
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    nodes = [helper.make_node("MatMul", ["a", "b"], [f"c{i}"]) for i in range(int(sys.argv[7]))]
    graph = helper.make_graph(nodes, "products", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, [m, n]) for node in nodes],
                              [numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    per_call = len(nodes)
    call = lambda: session.run(None, {"a": a})
else:
    import torch
    torch.set_num_threads(threads)
    ta, tb = torch.from_numpy(a), torch.from_numpy(np.ascontiguousarray(b.T))
    out = torch.empty(m, n)
    per_call = 1
    call = lambda: torch.mm(ta, tb.t(), out=out)
for _ in range(3):
    call()
best, calls, start = float("inf"), 0, time.perf_counter()
while calls < 5 or time.perf_counter() - start < seconds:
    begin = time.perf_counter()
    call()
    best = min(best, time.perf_counter() - begin)
    calls += 1
print(json.dumps({"gflops": 2.0 * m * n * k * per_call / best / 1e9}))
"""


def onednn(shape, threads):
    flops = 2.0 * shape[1] * shape[2] * shape[3]
    repeats = str(max(5, int(0.5 * 60e9 * threads / flops)))  # about half a second at 60 GFLOP/s a thread
    out = subprocess.run([SGEMM, "--m", str(shape[1]), "--n", str(shape[2]), "--k", str(shape[3]), "--threads",
                          str(threads), "--repeats", repeats], capture_output=True, text=True, check=True).stdout
    return json.loads(out)["gflops"]


def child(side, shape, threads):
    out = subprocess.run([sys.executable, "-c", CHILD, side, str(shape[1]), str(shape[2]), str(shape[3]), str(threads),
                          "0.5", str(NODES)], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["gflops"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()
    if not os.path.exists(SGEMM):
        sys.exit(f"no {SGEMM}: run scripts/build release first")
    print("| shape | M x N x K | threads | oneDNN 2.6 | MLAS (ONNX Runtime 1.30) | MKL (PyTorch 2.13) | MLAS / oneDNN "
          "| MKL / oneDNN |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        for threads in (int(t) for t in args.threads.split(",")):
            runs = {"onednn": [], "mlas": [], "mkl": []}
            for _ in range(args.reps):
                runs["onednn"].append(onednn(shape, threads))
                runs["mlas"].append(child("mlas", shape, threads))
                runs["mkl"].append(child("mkl", shape, threads))
            med = {side: statistics.median(values) for side, values in runs.items()}
            print(f"| {shape[0]} | {shape[1]} x {shape[2]} x {shape[3]} | {threads} | {med['onednn']:.0f} | "
                  f"{med['mlas']:.0f} | {med['mkl']:.0f} | {med['mlas'] / med['onednn']:.2f} | "
                  f"{med['mkl'] / med['onednn']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
