#!/usr/bin/env python3
"""The ceiling of a training step, measured in the same run as the step: how fast it could be if
it did nothing but its matrix products and convolutions, each as fast as oneDNN runs it alone
(bench/gemm_peak.py, bench/conv_peak.py), and its optimizer's update, as fast as a bare pass over
the same arrays runs alone (bench/bench_stream.cpp), one after the other, as onnxtrain's executor
runs kernels. Everything else a step does (activations, normalizations, losses, the executor's own
time) is left out, so no step can be faster than its ceiling; the operands of both parts are warm
in cache, as repeated runs leave them, where a step finds them after other work.

At the ceiling a step reaches `GFLOP / ceiling` GFLOP/s: where that is below 75 % of the sgemm peak
of the same run, issue 18's "GEMM- and convolution-bound steps at >= 75 % of the machine's measured
peak" is out of reach on the sgemm yardstick in that run; where the kernels' share of the ceiling
(kernels alone / ceiling) is below 75 %, it is out of reach on the yardstick of oneDNN's own kernels
at the workload's shapes. docs/performance.md shows both for every workload.

Usage: .venv/bin/python bench/ceiling.py TRAIN_MODEL.onnx [--threads 2]
(prints the trained parameters, the optimizer and its pass alone)
"""
import argparse
import json
import math
import os
import subprocess
import sys

import onnx
from google.protobuf.message import DecodeError

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# (arrays read, arrays read and written) by one update of each parameter: the gradient is read;
# the weight and the optimizer's state are read and written (Adam: both moments; Momentum: the
# velocity; Adagrad: the accumulated squares). ai.onnx.preview.training's optimizers.
OPTIMIZER_ARRAYS = {"Adam": (1, 3), "Momentum": (1, 2), "Adagrad": (1, 2)}
PASS_REPEATS = 20


def trained_parameters(train_model):
    """(trained parameters, the optimizer's op type) of a model with a training program
    (`onnxtrain make-trainable`): the elements of the initializers the Gradient node's xs name, and
    the optimizer node of the algorithm graph."""
    model = onnx.load(train_model, load_external_data=False)
    sizes = {t.name: math.prod(t.dims) for t in model.graph.initializer}
    count, optimizers = 0, set()
    for info in model.training_info:
        for node in info.algorithm.node:
            if node.op_type == "Gradient":
                xs = next(a.strings for a in node.attribute if a.name == "xs")
                count += sum(sizes.get(x.decode(), 0) for x in xs)
            elif node.op_type in OPTIMIZER_ARRAYS:
                optimizers.add(node.op_type)
    if count == 0 or len(optimizers) != 1:
        raise ValueError(f"{train_model}: expected a Gradient node over initializers and one of "
                         f"{', '.join(OPTIMIZER_ARRAYS)} in its training program, found {count} parameters and "
                         f"{', '.join(sorted(optimizers)) or 'no optimizer'}")
    return count, optimizers.pop()


def optimizer_pass_ms(tool, train_model, threads):
    """(ms, parameters, optimizer): the fastest pass of bench_stream over the arrays the model's
    optimizer reads and writes, at `threads`."""
    count, optimizer = trained_parameters(train_model)
    reads, updates = OPTIMIZER_ARRAYS[optimizer]
    out = subprocess.run([tool, "--floats", str(count), "--reads", str(reads), "--updates", str(updates), "--threads",
                          str(threads), "--repeats", str(PASS_REPEATS)], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"{tool} exited {out.returncode}: {out.stderr.strip()[-300:]}")
    return json.loads(out.stdout)["ms"], count, optimizer


def cell(kernels_ms, pass_ms, gflop, peak_gflops, decimals=2):
    """The ceiling's table cell: 'ms (fraction of the sgemm peak; the kernels' share)'."""
    ceiling = kernels_ms + pass_ms
    of_peak = gflop / (ceiling / 1e3) / peak_gflops
    return f"{ceiling:.{decimals}f} ({of_peak:.0%}; {kernels_ms / ceiling:.0%})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model with a training program (onnxtrain make-trainable)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    args = parser.parse_args()
    try:
        ms, count, optimizer = optimizer_pass_ms(os.path.join(args.build, "bench", "onnxtrain-bench-stream"),
                                                 args.model, args.threads)
    except (OSError, ValueError, RuntimeError, subprocess.TimeoutExpired, DecodeError) as e:
        sys.exit(f"error: {e}" if args.model in str(e) else f"error: {args.model}: {e}")
    print(json.dumps({"parameters": count, "optimizer": optimizer, "pass_ms": ms}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
