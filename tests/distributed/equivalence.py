#!/usr/bin/env python3
"""Data-parallel equivalence (issue 17, docs/distributed.md): `mpirun -np N onnxtrain train`
with a global batch of 128 against one process with a batch of 128: 20 steps of Adam on the
Fashion-MNIST MLP (examples/fashion_mnist/make_model.py) on a synthetic .npz (random images and
labels; 19 batches of 128 and a last one of 100, so with 3 ranks the shares are uneven: 42/43/43
and 33/33/34, and the sample-count weighting matters).

- N = 1: the cut program (forward+backward, reduce, update) must give weights bit-identical to
  the uncut one (the cut itself loses nothing).
- N > 1: every parameter tensor within rtol 1e-5, measured as |w_N - w_1| / |w_1| (Frobenius
  norms). Why norm-wise and not per element: each rank sums its 64 rows of dW = dY^T X in
  float32, so the gradient differs from the 128-row sum by rounding (~1e-7 relative); Adam
  divides by sqrt(v), which turns that into large relative differences for the few elements
  whose gradient is a near-cancelling sum (measured: max |diff| 2.8e-6 on weights of about
  0.04, norm-wise 2.8e-7). One process is bit-identical with 1 and 2 threads
  (--reference-threads 2 shows it), so the spread comes from the split batch alone.
- N = 2 with --batch-size 1: rank 0 gets no rows (rows [0, 0)) of any batch; it runs the row of
  rank 1 and weighs it 0, so 30 steps give weights bit-identical to one process's.
- The loss of every step (rank 0's metrics, the averaged loss) within rtol 1e-5 of the single
  process's, and both ran 20 steps; the evaluation on the test split (sharded: each rank infers
  its rows of every batch, the sums are added across ranks) gives the same accuracy and a loss
  within rtol 1e-6. The N-rank run checks every rank's state against rank 0's after every step
  (--checksum-every 1: the ranks' models stay bit-identical).
Skipped (exit 77, ctest SKIP_RETURN_CODE) without mpirun.

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


def variables(path):
    """Every initializer of the model: the inference graph's and the training_info algorithms'
    (weights and optimizer state)."""
    model = onnx.load(path)
    tensors = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for info in model.training_info:
        tensors.update({t.name: numpy_helper.to_array(t) for t in info.algorithm.initializer})
    return tensors


def mpi_setup():
    """(mpirun's path, the environment of its ranks: one OpenMP thread, root allowed), or None
    (after printing why) when mpirun is missing: the test then exits 77 (skipped)."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        print("SKIP: mpirun not found (apt-get install openmpi-bin)")
        return None
    return mpirun, dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--onnxtrain", required=True)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--reference-threads", type=int, default=1,
                        help="threads of the single process (to compare its own rounding spread)")
    args = parser.parse_args()
    setup = mpi_setup()
    if setup is None:
        return 77
    mpirun, env = setup
    rng = np.random.default_rng(17)
    samples = BATCH * (STEPS - 1) + 100  # 19 full batches and a last one of 100
    with tempfile.TemporaryDirectory() as d:
        np.savez(os.path.join(d, "data.npz"), image=rng.integers(0, 256, (samples, 784), dtype=np.uint8),
                 label=rng.integers(0, 10, samples, dtype=np.int64))
        # The test split (data_test.npz beside it): 1000 rows, batches of 128 and a last one of 104.
        np.savez(os.path.join(d, "data_test.npz"), image=rng.integers(0, 256, (1000, 784), dtype=np.uint8),
                 label=rng.integers(0, 10, 1000, dtype=np.int64))
        run([sys.executable, os.path.join(HERE, "..", "..", "examples", "fashion_mnist", "make_model.py"), d])
        run([args.onnxtrain, "make-trainable", os.path.join(d, "mlp.onnx"), "-o", os.path.join(d, "train.onnx"),
             "--loss", "cross_entropy", "--optimizer", "adam", "--lr", "1e-3"])
        common = ["train", os.path.join(d, "train.onnx"), "--data", os.path.join(d, "data.npz"), "--map", "x=image",
                  "--scale", "image=1/255", "--batch-size", str(BATCH), "--epochs", "1", "--seed", "3",
                  "--threads", "1", "-q"]
        run([args.onnxtrain] + common + ["-o", os.path.join(d, "one.onnx"), "--metrics", os.path.join(d, "one.jsonl")])
        if args.reference_threads != 1:  # the same single process with other threads, as "many"
            run([args.onnxtrain] + common[:-3] + ["--threads", str(args.reference_threads), "-q", "-o",
                 os.path.join(d, "many.onnx"), "--metrics", os.path.join(d, "many.jsonl")])
        if args.reference_threads == 1:
          run([mpirun, "-np", str(args.ranks), "--oversubscribe", args.onnxtrain] + common +
              ["-o", os.path.join(d, "many.onnx"), "--metrics", os.path.join(d, "many.jsonl"), "--checksum-every", "1"],
              env=env)

        one, many = weights(os.path.join(d, "one.onnx")), weights(os.path.join(d, "many.onnx"))
        initial = weights(os.path.join(d, "mlp.onnx"))
        failures = 0
        for name in sorted(initial):
            a, b = one[name], many[name]
            moved = np.abs(a - initial[name]).max()
            relative = np.linalg.norm(b - a) / np.linalg.norm(a)
            exact = np.array_equal(a, b)
            ok = moved > 0 and (exact if args.ranks == 1 else relative <= 1e-5)
            print(f"{name}: moved {moved:.3g}, max |diff| {np.abs(a - b).max():.3g}, "
                  f"|diff|/|w| {relative:.3g}{' (bit-identical)' if exact else ''} {'ok' if ok else 'FAIL'}")
            failures += not ok
        records = lambda p, kind: [json.loads(l) for l in open(p) if json.loads(l)["type"] == kind]
        l1 = [r["loss"] for r in records(os.path.join(d, "one.jsonl"), "step")]
        l2 = [r["loss"] for r in records(os.path.join(d, "many.jsonl"), "step")]
        print(f"steps: {len(l1)} vs {len(l2)}; last loss {l1[-1]:.6f} vs {l2[-1]:.6f}")
        if len(l1) != STEPS or len(l2) != STEPS or not np.allclose(l2, l1, rtol=1e-5):
            print("FAIL: the loss records differ")
            failures += 1
        e1, e2 = records(os.path.join(d, "one.jsonl"), "eval"), records(os.path.join(d, "many.jsonl"), "eval")
        print(f"evaluation: {e1} vs {e2}")
        if (len(e1) != 1 or len(e2) != 1 or e1[0]["test_accuracy"] != e2[0]["test_accuracy"]
                or not np.isclose(e2[0]["test_loss"], e1[0]["test_loss"], rtol=1e-6)):
            print("FAIL: the sharded evaluation differs from one process's")
            failures += 1
        if args.ranks == 2:  # rank 0 has no rows of a batch of 1: it weighs rank 1's row 0
            small = common[:8] + ["--batch-size", "1", "--max-steps", "30", "--seed", "3", "--threads", "1", "-q"]
            run([args.onnxtrain] + small + ["-o", os.path.join(d, "one_1.onnx")])
            run([mpirun, "-np", "2", "--oversubscribe", args.onnxtrain] + small + ["-o", os.path.join(d, "many_1.onnx")],
                env=env)
            a, b = weights(os.path.join(d, "one_1.onnx")), weights(os.path.join(d, "many_1.onnx"))
            same = all(np.array_equal(a[k], b[k]) for k in initial)
            print(f"batch of 1 row on 2 ranks: {'bit-identical, ok' if same else 'FAIL: differs from one process'}")
            failures += not same
    print("PASS" if failures == 0 else f"FAIL: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
