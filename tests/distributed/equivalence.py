#!/usr/bin/env python3
"""Data-parallel equivalence (issue 17, docs/distributed.md): `mpirun -np 2 onnxtrain train`
with a global batch of 128 ends with the weights of one process with a batch of 128, after 20
steps of Adam on the Fashion-MNIST MLP (examples/fashion_mnist/make_model.py), on a synthetic
.npz (random images and labels: the cut does not depend on what is learned). Every parameter
within rtol 1e-5 (float32). Also: the loss records of rank 0 equal the single process's, and
the last global batch of 100 samples (uneven shares would still be exact; here 50/50) is
included by --epochs so the sample-count weighting runs. Skipped (ctest code 77) without mpirun.

Usage: equivalence.py --onnxtrain PATH
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 20
BATCH = 128


def run(cmd, env=None):
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(cmd)}\n{result.stdout}\n{result.stderr}")
    return result.stdout


def weights(path):
    model = onnx.load(path)
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--onnxtrain", required=True)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    mpirun = shutil.which("mpirun")
    if not mpirun:
        print("SKIP: mpirun not found (apt-get install openmpi-bin)")
        return 77
    rng = np.random.default_rng(17)
    samples = BATCH * (STEPS - 1) + 100  # 19 full batches and a last one of 100
    with tempfile.TemporaryDirectory() as d:
        np.savez(os.path.join(d, "data.npz"), image=rng.integers(0, 256, (samples, 784), dtype=np.uint8),
                 label=rng.integers(0, 10, samples, dtype=np.int64))
        run([sys.executable, os.path.join(HERE, "..", "..", "examples", "fashion_mnist", "make_model.py"), d])
        run([args.onnxtrain, "make-trainable", os.path.join(d, "mlp.onnx"), "-o", os.path.join(d, "train.onnx"),
             "--loss", "cross_entropy", "--optimizer", "adam", "--lr", "1e-3"])
        common = ["train", os.path.join(d, "train.onnx"), "--data", os.path.join(d, "data.npz"), "--map", "x=image",
                  "--scale", "image=1/255", "--batch-size", str(BATCH), "--epochs", "1", "--seed", "3",
                  "--threads", "1", "-q"]
        run([args.onnxtrain] + common + ["-o", os.path.join(d, "one.onnx"), "--metrics", os.path.join(d, "one.jsonl")])
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
        run([mpirun, "-np", str(args.ranks), "--oversubscribe", args.onnxtrain] + common +
            ["-o", os.path.join(d, "many.onnx"), "--metrics", os.path.join(d, "many.jsonl")], env=env)

        one, many = weights(os.path.join(d, "one.onnx")), weights(os.path.join(d, "many.onnx"))
        initial = weights(os.path.join(d, "mlp.onnx"))
        failures = 0
        for name in sorted(initial):
            a, b = one[name], many[name]
            moved = np.abs(a - initial[name]).max()
            worst = np.max(np.abs(a - b) / (1e-5 * np.abs(a) + 1e-12))
            ok = np.allclose(b, a, rtol=1e-5, atol=0) and moved > 0
            print(f"{name}: moved {moved:.3g}, max |diff|/(1e-5|w|) {worst:.3g} {'ok' if ok else 'FAIL'}")
            failures += not ok
        loss = lambda p: [json.loads(l)["loss"] for l in open(p) if json.loads(l)["type"] == "step"]
        l1, l2 = loss(os.path.join(d, "one.jsonl")), loss(os.path.join(d, "many.jsonl"))
        print(f"steps: {len(l1)} vs {len(l2)}; last loss {l1[-1]:.6f} vs {l2[-1]:.6f}")
        if len(l1) != STEPS or len(l2) != STEPS or not np.allclose(l2, l1, rtol=1e-5):
            print("FAIL: the loss records differ")
            failures += 1
    print("PASS" if failures == 0 else f"FAIL: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
