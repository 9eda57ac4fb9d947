#!/usr/bin/env python3
"""ONNX Runtime side of bench/run_bench.py, with the onnxruntime wheel of the project's .venv.

Usage: ort_infer.py MODEL.onnx BATCH THREADS [ITERS]
Prints {"ms": median milliseconds per run} of ITERS runs (default 200) after 10 warm-up runs on random
inputs (float32[BATCH, 1, 28, 28] for the CNN's input, float32[BATCH, 784] otherwise).
"""
import json
import sys
import time

import numpy as np
import onnxruntime as ort


def main():
    model, batch, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    iters = int(sys.argv[4]) if len(sys.argv) > 4 else 200
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {}
    for arg in session.get_inputs():
        dims = [batch, 1, 28, 28] if "cnn" in model else [batch, 784]
        feeds[arg.name] = rng.random(dims, dtype=np.float32)
    for _ in range(10):
        session.run(None, feeds)
    ms = []
    for _ in range(iters):
        start = time.perf_counter()
        session.run(None, feeds)
        ms.append((time.perf_counter() - start) * 1e3)
    print(json.dumps({"ms": float(np.median(ms))}))


if __name__ == "__main__":
    main()
