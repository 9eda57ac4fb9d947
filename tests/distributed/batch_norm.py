#!/usr/bin/env python3
"""BatchNormalization in data-parallel training (issue 17, docs/distributed.md "BatchNormalization").

A small CNN, x [N, 3, 8, 8] -> BatchNormalization (bn0, on the input: its statistics depend on
the data alone) -> Conv 3x3 -> BatchNormalization (bn1) -> Relu -> MaxPool 2x2 -> Flatten ->
Gemm -> 10 logits, opset 15, both BatchNormalizations in training mode; made trainable with
`make-trainable --optimizer momentum` (SGD with momentum). 20 steps of a global batch of 128
on synthetic data, in order (--no-shuffle): 19 batches of 128 and a last one of 101, which 2
ranks share unevenly (50/51). The rows in the first half of every batch are shifted by +1, so
the two ranks' shares have clearly different statistics.

(a) --sync-batch-norm on 2 ranks equals 1 process (opset 15, and opset 12 where BatchNormalization-9
    is in training mode by its five outputs): every float initializer (parameters and running statistics) within |w_2 - w_1| / |w_1| <= 1e-5 (Frobenius norms, as
    equivalence.py measures: the gradient sums differ by float32 rounding between 64-row and
    128-row sums, which momentum carries on; a few elements near a cancelling sum have larger
    relative differences), and the loss of every step within rtol 1e-5.
(b) without it (each rank normalizes with its share, as PyTorch DDP):
    - bn0's running mean and variance equal their expected values computed here from the data:
      the EMA (momentum 0.8) of the share-size-weighted mean of the two shares' statistics
      (rtol 1e-5), while with --sync-batch-norm they equal the EMA of the global batch's;
    - the model differs from 1 process (bn0's running variance, the BN-affected parameters:
      largest per-tensor difference > 1e-3, far beyond what (a) allows);
    - identical across ranks: rank 0 alone writes the model, so the test runs the 2 ranks a
      second time with the halves of every batch swapped in the data file (rank 0 then gets the
      rows rank 1 had, and the reverse; --drop-last keeps the shares even). If the ranks held
      different models (say a running statistic kept per rank, or an update from a rank's own
      gradient), the second run's rank 0 would write rank 1's model of the first; both runs
      must write the same model (within 1e-6 per tensor; the allreduce of two values is
      commutative, so it is bit-identical here).
(c) the CNN without BatchNormalization, SGD with momentum: 2 ranks equal 1 process within
    rtol 1e-5 per tensor (norm-wise), every parameter moved.
Skipped (exit 77, ctest SKIP_RETURN_CODE) without mpirun.

Usage: batch_norm.py --onnxtrain PATH
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from equivalence import run, weights, mpi_setup  # this script's folder comes first on sys.path

BATCH = 128
SAMPLES = BATCH * 19 + 101
BN0_MOMENTUM = 0.8


def cnn(batch_norm, path, opset=15):
    rng = np.random.default_rng(5)
    inits, nodes = [], []

    def init(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))

    def bn(name, x, y, channels, **attrs):
        init(name + ".scale", rng.uniform(0.5, 1.5, channels))
        init(name + ".bias", rng.uniform(-0.2, 0.2, channels))
        init(name + ".mean", np.zeros(channels))
        init(name + ".var", np.ones(channels))
        outputs = [y, name + ".running_mean", name + ".running_var"]
        if opset < 14:  # training mode: the statistics outputs asked for (BatchNormalization-9: all five)
            outputs += [name + ".saved_mean", name + ".saved_var"]
        else:
            attrs["training_mode"] = 1
        nodes.append(helper.make_node("BatchNormalization", [x] + [name + s for s in (".scale", ".bias", ".mean", ".var")],
                                      outputs, **attrs))

    x = "x"
    if batch_norm:
        bn("bn0", "x", "x0", 3, momentum=BN0_MOMENTUM)
        x = "x0"
    init("conv.w", rng.normal(0, 0.3, (8, 3, 3, 3)))
    init("conv.b", rng.normal(0, 0.1, 8))
    nodes.append(helper.make_node("Conv", [x, "conv.w", "conv.b"], ["c"], pads=[1, 1, 1, 1]))
    y = "c"
    if batch_norm:
        bn("bn1", "c", "b", 8)
        y = "b"
    init("fc.w", rng.normal(0, 0.1, (10, 128)))
    init("fc.b", np.zeros(10))
    nodes += [helper.make_node("Relu", [y], ["r"]),
              helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
              helper.make_node("Flatten", ["p"], ["f"]),
              helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)


def batches(n):
    return [(b, min(b + BATCH, n)) for b in range(0, n, BATCH)]


def expected_bn0(images, ranks, initial):
    """bn0's running (mean, var) after every batch: the EMA of the share-size-weighted mean of the
    ranks' share statistics (ranks = 1: the global batch's). Population variances, as ONNX's
    current_var; float32 storage after each step, as the model's."""
    mean, var = initial["bn0.mean"].astype(np.float64), initial["bn0.var"].astype(np.float64)
    for begin, end in batches(len(images)):
        n = end - begin
        m, v = 0.0, 0.0
        for r in range(ranks):
            share = images[begin + n * r // ranks:begin + n * (r + 1) // ranks].astype(np.float64)
            m = m + share.mean(axis=(0, 2, 3)) * len(share) / n
            v = v + share.var(axis=(0, 2, 3)) * len(share) / n
        mean = np.float32(mean * BN0_MOMENTUM + m * (1 - BN0_MOMENTUM)).astype(np.float64)
        var = np.float32(var * BN0_MOMENTUM + v * (1 - BN0_MOMENTUM)).astype(np.float64)
    return {"bn0.mean": mean, "bn0.var": var}


def relative(a, b):
    return float(np.linalg.norm(b.astype(np.float64) - a) / np.linalg.norm(a))


def compare(label, reference, other, names, rtol, initial=None):
    failures = 0
    for name in names:
        a, b = reference[name], other[name]
        r = relative(a, b)
        ok = r <= rtol and (initial is None or np.abs(a - initial[name]).max() > 0)
        print(f"{label}: {name}: |diff|/|w| {r:.3g}, max |diff| {np.abs(b - a).max():.3g} {'ok' if ok else 'FAIL'}")
        failures += not ok
    return failures


def losses(path):
    return [json.loads(line)["loss"] for line in open(path) if json.loads(line)["type"] == "step"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--onnxtrain", required=True)
    args = parser.parse_args()
    setup = mpi_setup()
    if setup is None:
        return 77
    mpirun, env = setup
    rng = np.random.default_rng(17)
    images = rng.normal(0.5, 1.0, (SAMPLES, 3, 8, 8)) * np.array([0.5, 1.0, 2.0]).reshape(1, 3, 1, 1)
    first_half = np.array([(i % BATCH) < (min(BATCH, SAMPLES - i // BATCH * BATCH) // 2) for i in range(SAMPLES)])
    images[first_half] += 1.0
    images = images.astype(np.float32)
    labels = rng.integers(0, 10, SAMPLES, dtype=np.int64)
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        p = lambda name: os.path.join(d, name)
        np.savez(p("data.npz"), image=images, label=labels)
        # The same rows with the halves of every full batch swapped (for the ranks' roles).
        order = np.concatenate([np.r_[b + BATCH // 2:b + BATCH, b:b + BATCH // 2] for b, e in batches(SAMPLES) if e - b == BATCH])
        np.savez(p("swapped.npz"), image=images[order], label=labels[order])
        for bn, name, opset in ((True, "bn", 15), (False, "nobn", 15), (True, "bn12", 12)):
            cnn(bn, p(name + ".onnx"), opset)
            run([args.onnxtrain, "make-trainable", p(name + ".onnx"), "-o", p(name + "_train.onnx"),
                 "--optimizer", "momentum", "--lr", "0.05", "--momentum", "0.9"])

        def train(model, out, ranks, *extra, data="data.npz"):
            cmd = [args.onnxtrain, "train", p(model), "--data", p(data), "--map", "x=image", "--batch-size", str(BATCH),
                   "--no-shuffle", "--threads", "1", "-q", "-o", p(out + ".onnx"), "--metrics", p(out + ".jsonl")] + list(extra)
            run(([mpirun, "-np", str(ranks), "--oversubscribe"] if ranks > 1 else []) + cmd, env=env)
            return weights(p(out + ".onnx"))

        initial = weights(p("bn.onnx"))
        floats = sorted(n for n, t in initial.items() if t.dtype == np.float32)
        one = train("bn_train.onnx", "one", 1)
        synced = train("bn_train.onnx", "synced", 2, "--sync-batch-norm")
        # --checksum-every 1: every rank's state equals rank 0's after every step (or the run fails).
        default = train("bn_train.onnx", "default", 2, "--checksum-every", "1")
        synced_checked = train("bn_train.onnx", "synced_checked", 2, "--sync-batch-norm", "--checksum-every", "1")
        ok = all(np.array_equal(synced[n], synced_checked[n]) for n in floats)
        print(f"--checksum-every 1 passes with and without --sync-batch-norm {'ok' if ok else 'FAIL'}")
        failures += not ok

        # (a) --sync-batch-norm: 2 ranks equal 1 process.
        failures += compare("(a) synced vs 1 process", one, synced, floats, 1e-5, initial)
        l1, l2 = losses(p("one.jsonl")), losses(p("synced.jsonl"))
        ok = len(l1) == len(l2) == 20 and np.allclose(l2, l1, rtol=1e-5)
        print(f"(a) losses: {len(l1)} and {len(l2)} steps, last {l1[-1]:.6f} vs {l2[-1]:.6f} {'ok' if ok else 'FAIL'}")
        failures += not ok

        # (a) with BatchNormalization-9 (opset 12: training mode by its outputs, five of them)
        failures += compare("(a) opset 12, synced vs 1 process", train("bn12_train.onnx", "one12", 1),
                            train("bn12_train.onnx", "synced12", 2, "--sync-batch-norm"), floats, 1e-5, initial)

        # (b) default: running statistics averaged, the model differs from one process, ranks identical.
        for ranks, label, result in ((2, "default", default), (1, "synced", synced), (1, "1 process", one)):
            expected = expected_bn0(images, ranks, initial)
            failures += compare(f"(b) {label}: bn0 running statistics vs the expected EMA", expected, result,
                                ["bn0.mean", "bn0.var"], 1e-5)
        spread = max(relative(one[n], default[n]) for n in floats)
        ok = spread > 1e-3
        print(f"(b) default vs 1 process: largest |diff|/|w| {spread:.3g} (> 1e-3: the shares' statistics matter) "
              f"{'ok' if ok else 'FAIL'}")
        failures += not ok
        first = train("bn_train.onnx", "roles_a", 2, "--drop-last")
        second = train("bn_train.onnx", "roles_b", 2, "--drop-last", data="swapped.npz")
        failures += compare("(b) rank 0's model vs rank 1's (roles swapped)", first, second, floats, 1e-6)
        roles_one = train("bn_train.onnx", "roles_one", 1, "--drop-last")
        swapped_spread = max(relative(roles_one[n], first[n]) for n in floats)
        ok = swapped_spread > 1e-3
        print(f"(b) (the roles' runs differ from 1 process by {swapped_spread:.3g}, so equal roles is no accident) "
              f"{'ok' if ok else 'FAIL'}")
        failures += not ok

        # (c) the CNN without BatchNormalization: 2 ranks equal 1 process.
        plain = weights(p("nobn.onnx"))
        failures += compare("(c) no BatchNormalization, 2 ranks vs 1", train("nobn_train.onnx", "nobn_one", 1),
                            train("nobn_train.onnx", "nobn_two", 2), sorted(plain), 1e-5, plain)
    print("PASS" if failures == 0 else f"FAIL: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
