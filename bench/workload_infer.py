#!/usr/bin/env python3
"""ONNX Runtime's inference timing for bench/workloads.py, through its Python API (the onnxruntime
wheel of the project's .venv); onnxtrain's side is onnxtrain-bench-infer, in process. Inputs are
one synthetic batch of the workload (workload_data.sample_input).

Usage: workload_infer.py MODEL.onnx WORKLOAD BATCH THREADS [ITERS]
Prints {"ms": median milliseconds per run} of ITERS runs (default 20) after 3 warm-up runs.
"""
import json
import sys
import time

import numpy as np
import onnxruntime as ort

import workload_data


def main():
    model, workload, batch, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    iters = int(sys.argv[5]) if len(sys.argv) > 5 else 20
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feeds = {workload_data.input_name(workload): workload_data.sample_input(workload, batch,
                                                                                 np.random.default_rng(0))}
    for _ in range(3):
        session.run(None, feeds)
    ms = []
    for _ in range(iters):
        start = time.perf_counter()
        session.run(None, feeds)
        ms.append((time.perf_counter() - start) * 1e3)
    print(json.dumps({"ms": float(np.median(ms))}))


if __name__ == "__main__":
    main()
