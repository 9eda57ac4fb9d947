#!/usr/bin/env python3
"""`onnxtrain train` against PyTorch on Fashion-MNIST: the end-to-end path, CI-sized.

Writes the example MLP (examples/fashion_mnist/make_model.py), makes it trainable
(cross_entropy, adam, lr 1e-3), and trains it for 50 steps of batch 64 without shuffling on
the first 3200 training images, through `onnxtrain train` (reading an .npz subset, scaling
pixels by 1/255) and through torch.optim.Adam from the same initial weights on the same
batches. The loss of every step and the final weights must agree to rtol 1e-3 (atol 1e-4:
Adam's epsilon placement differs, docs/make-trainable.md). Also checks the exported
inference model's test accuracy is above chance.

Usage: train_parity.py --onnxtrain build/release/src/onnxtrain
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import torch
from onnx import numpy_helper

DATA = "/usr/share/datasets/fashion-mnist"
HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, BATCH, SAMPLES = 50, 64, 3200


def read_idx(path):
    with gzip.open(path) as f:
        data = f.read()
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(" ".join(cmd) + f" exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnxtrain", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    images = read_idx(os.path.join(DATA, "train-images-idx3-ubyte.gz"))[:SAMPLES]
    labels = read_idx(os.path.join(DATA, "train-labels-idx1-ubyte.gz"))[:SAMPLES]
    test_images = read_idx(os.path.join(DATA, "t10k-images-idx3-ubyte.gz"))[:1000]
    test_labels = read_idx(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz"))[:1000]
    with tempfile.TemporaryDirectory() as d:
        np.savez(os.path.join(d, "subset.npz"), image=images, label=labels,
                 **{"test/image": test_images, "test/label": test_labels})
        run([sys.executable, os.path.join(HERE, "..", "..", "examples", "fashion_mnist", "make_model.py"), d])
        run([args.onnxtrain, "make-trainable", os.path.join(d, "mlp.onnx"), "-o", os.path.join(d, "train.onnx"),
             "--loss", "cross_entropy", "--optimizer", "adam", "--lr", "1e-3"])
        started = time.time()
        run([args.onnxtrain, "train", os.path.join(d, "train.onnx"), "--data", os.path.join(d, "subset.npz"),
             "--map", "x=image", "--scale", "image=1/255", "--batch-size", str(BATCH), "--no-shuffle",
             "--max-steps", str(STEPS), "--epochs", "2", "--metrics", os.path.join(d, "metrics.jsonl"),
             "-o", os.path.join(d, "trained.onnx"), "--export-inference", os.path.join(d, "inference.onnx"), "-q"])
        seconds = time.time() - started
        records = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]
        got = [r["loss"] for r in records if r["type"] == "step"]
        accuracy = [r["test_accuracy"] for r in records if r["type"] == "eval"]

        initial = {t.name: numpy_helper.to_array(t) for t in onnx.load(os.path.join(d, "mlp.onnx")).graph.initializer}
        trained = {t.name: numpy_helper.to_array(t) for t in onnx.load(os.path.join(d, "trained.onnx")).graph.initializer}
        model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                    torch.nn.ReLU(), torch.nn.Linear(512, 10))
        names = {"0": "fc1", "2": "fc2", "4": "fc3"}
        with torch.no_grad():
            for name, p in model.named_parameters():
                layer, kind = name.split(".")
                p.copy_(torch.from_numpy(initial[f"{names[layer]}.{kind}"]))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        x_all = torch.from_numpy(images.reshape(SAMPLES, 784).astype(np.float32)) * (1.0 / 255)
        y_all = torch.from_numpy(labels.astype(np.int64))
        want = []
        for step in range(STEPS):
            b = step % (SAMPLES // BATCH)
            x, y = x_all[b * BATCH:(b + 1) * BATCH], y_all[b * BATCH:(b + 1) * BATCH]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            want.append(loss.item())
            loss.backward()
            optimizer.step()

    ok = True
    if len(got) != STEPS or not np.allclose(got, want, rtol=1e-3, atol=1e-4):
        print(f"FAIL losses differ: onnxtrain {got[:2]}...{got[-1:]} torch {want[:2]}...{want[-1:]}")
        ok = False
    for name, p in model.named_parameters():
        layer, kind = name.split(".")
        mine = trained[f"{names[layer]}.{kind}"]
        if not np.allclose(mine, p.detach().numpy(), rtol=1e-3, atol=1e-4):
            print(f"FAIL weight {names[layer]}.{kind} differs by {np.max(np.abs(mine - p.detach().numpy())):.3g}")
            ok = False
    if not accuracy or accuracy[-1] < 0.5:
        print(f"FAIL test accuracy {accuracy} after {STEPS} steps")
        ok = False
    if ok:
        print(f"ok   {STEPS} steps of `onnxtrain train` match torch.optim.Adam (losses {want[0]:.4f} -> {want[-1]:.4f}); "
              f"test accuracy {accuracy[-1]:.3f}; {seconds:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
