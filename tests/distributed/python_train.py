#!/usr/bin/env python3
"""The Python `onnxtrain.train` under mpirun (issue 17, docs/distributed.md): `mpirun -np 2
python python_train.py --worker DIR` trains the Fashion-MNIST MLP (Adam) for 20 steps of 128
on synthetic data, given as a dict of arrays and, in a second run, as a torch DataLoader with a
seeded generator; the test compares with the same calls in one process:
- every rank returns the same steps, loss and model (each rank writes its weights to a .npz);
- the weights equal the single process's within per-tensor rtol 1e-5 (as equivalence.py
  measures; dict input) and the DataLoader run equals the dict run on 2 ranks bit-identically
  when both feed the same batches (no shuffle);
- rank 0 alone writes the output file and shows progress;
- shard_optimizer_state=True (ZeRO-1) gives the plain 2-rank run's weights bit-identically.
Skipped (exit 77) without mpirun.

Usage: PYTHONPATH=BUILD/python python_train.py --onnxtrain PATH
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

from equivalence import mpi_setup  # this script's folder comes first on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, BATCH = 20, 128


def worker(d):
    import onnx
    import torch
    from onnx import numpy_helper

    import onnxtrain

    world = onnxtrain._core._world()
    rank = world[0] if world else 0
    data = dict(np.load(os.path.join(d, "data.npz")))
    columns = {"x": data["image"].astype(np.float32) / 255, "label": data["label"]}
    model = onnx.load(os.path.join(d, "train.onnx"))
    tag = f"{world[1]}ranks" if world else "single"
    r = onnxtrain.train(model, columns, output=os.path.join(d, f"dict_{tag}.onnx"), batch_size=BATCH, seed=3,
                        shuffle=False, threads=1, progress="lines", checksum_every=5)
    weights = {t.name: numpy_helper.to_array(t) for t in r.model.graph.initializer}
    np.savez(os.path.join(d, f"dict_{tag}_rank{rank}.npz"), steps=r.steps, loss=r.last_loss, **weights)

    if world:  # ZeRO-1 from Python: bit-identical to the plain data-parallel run
        r = onnxtrain.train(model, columns, batch_size=BATCH, seed=3, shuffle=False, threads=1, progress=False,
                            shard_optimizer_state=True)
        weights = {t.name: numpy_helper.to_array(t) for t in r.model.graph.initializer}
        np.savez(os.path.join(d, f"zero_{tag}_rank{rank}.npz"), steps=r.steps, loss=r.last_loss, **weights)

    dataset = torch.utils.data.TensorDataset(torch.from_numpy(columns["x"]), torch.from_numpy(columns["label"]))
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=False)
    r = onnxtrain.train(model, _Batches(loader), seed=3,
                        threads=1, progress=False)
    weights = {t.name: numpy_helper.to_array(t) for t in r.model.graph.initializer}
    np.savez(os.path.join(d, f"loader_{tag}_rank{rank}.npz"), steps=r.steps, loss=r.last_loss, **weights)


class _Batches:
    """The DataLoader's (x, label) pairs as dicts naming the step inputs."""

    def __init__(self, loader):
        self.loader = loader

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        return ({"x": x, "label": y} for x, y in self.loader)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--onnxtrain", help="the onnxtrain executable (make-trainable)")
    parser.add_argument("--worker")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return 0
    setup = mpi_setup()
    if setup is None:
        return 77
    mpirun, env = setup
    rng = np.random.default_rng(23)
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        samples = BATCH * (STEPS - 1) + 100
        np.savez(os.path.join(d, "data.npz"), image=rng.integers(0, 256, (samples, 784), dtype=np.uint8),
                 label=rng.integers(0, 10, samples, dtype=np.int64))
        subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "examples", "fashion_mnist", "make_model.py"), d],
                       check=True, capture_output=True)
        subprocess.run([args.onnxtrain, "make-trainable", os.path.join(d, "mlp.onnx"), "-o",
                        os.path.join(d, "train.onnx"), "--loss", "cross_entropy", "--optimizer", "adam", "--lr", "1e-3"],
                       check=True, capture_output=True)
        me = os.path.abspath(__file__)
        single = subprocess.run([sys.executable, me, "--worker", d], capture_output=True, text=True, env=env)
        many = subprocess.run([mpirun, "-np", "2", "--oversubscribe", sys.executable, me, "--worker", d],
                              capture_output=True, text=True, env=env, timeout=600)
        for name, result in (("one process", single), ("mpirun -np 2", many)):
            if result.returncode != 0:
                print(f"FAIL: {name} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
                return 1
        load = lambda name: dict(np.load(os.path.join(d, name)))
        one = load("dict_single_rank0.npz")
        ranks = [load(f"dict_2ranks_rank{r}.npz") for r in range(2)]
        loaders = [load(f"loader_2ranks_rank{r}.npz") for r in range(2)]
        names = [k for k in one if k not in ("steps", "loss")]
        same = all(np.array_equal(ranks[0][k], ranks[1][k]) and np.array_equal(loaders[0][k], loaders[1][k])
                   for k in ranks[0])
        print(f"both ranks return the same steps, loss and weights: {'ok' if same else 'FAIL'}")
        failures += not same
        worst = max(np.linalg.norm(ranks[0][k] - one[k]) / np.linalg.norm(one[k]) for k in names)
        ok = int(ranks[0]["steps"]) == STEPS and worst <= 1e-5
        print(f"2 ranks vs one process ({int(ranks[0]['steps'])} steps): largest per-tensor |diff|/|w| {worst:.3g}: "
              f"{'ok' if ok else 'FAIL'}")
        failures += not ok
        same = all(np.array_equal(loaders[0][k], ranks[0][k]) for k in names)
        print(f"DataLoader input equals dict input on 2 ranks: {'ok' if same else 'FAIL'}")
        failures += not same
        zero = [load(f"zero_2ranks_rank{r}.npz") for r in range(2)]
        same = all(np.array_equal(zero[r][k], ranks[0][k]) for r in range(2) for k in names)
        print(f"shard_optimizer_state=True equals the plain run on both ranks: {'ok' if same else 'FAIL'}")
        failures += not same
        lines = many.stdout + many.stderr
        ok = lines.count("trained 20 steps") == 1 and os.path.exists(os.path.join(d, "dict_2ranks.onnx"))
        print(f"rank 0 alone shows progress and writes the output: {'ok' if ok else 'FAIL: ' + lines[-1000:]}")
        failures += not ok
    print("PASS" if failures == 0 else f"FAIL: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
