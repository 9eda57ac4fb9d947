#!/usr/bin/env python3
"""Inference timing of bench/workloads.py through Python: ONNX Runtime (the onnxruntime wheel of
the project's .venv) or onnxtrain's Python binding (onnxtrain.InferenceSession, for models whose
inputs onnxtrain-bench-infer cannot feed: it feeds random floats only, and BERT reads int64
token ids). Inputs are one synthetic batch of the workload (workload_models.sample_input).

Usage: workload_infer.py ort|onnxtrain MODEL.onnx WORKLOAD BATCH THREADS [ITERS]
Prints {"ms": median milliseconds per run} of ITERS runs (default 20) after 3 warm-up runs.
"""
import json
import sys
import time

import numpy as np

import workload_models


def make_runner(engine, model, threads):
    if engine == "ort":
        import onnxruntime as ort
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        return lambda feeds: session.run(None, feeds)
    import onnxtrain
    session = onnxtrain.InferenceSession(model, threads=threads)
    return session.run


def main():
    engine, model, workload, batch, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    iters = int(sys.argv[6]) if len(sys.argv) > 6 else 20
    run = make_runner(engine, model, threads)
    feeds = {workload_models.input_name(workload): workload_models.sample_input(workload, batch,
                                                                                 np.random.default_rng(0))}
    for _ in range(3):
        run(feeds)
    ms = []
    for _ in range(iters):
        start = time.perf_counter()
        run(feeds)
        ms.append((time.perf_counter() - start) * 1e3)
    print(json.dumps({"ms": float(np.median(ms))}))


if __name__ == "__main__":
    main()
