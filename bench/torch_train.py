#!/usr/bin/env python3
"""PyTorch side of bench/run_bench.py: trains the Fashion-MNIST MLP or CNN (weights read from the
ONNX file examples/fashion_mnist/make_model.py wrote) with Adam, batch 128, on the first
Fashion-MNIST batches held in memory, and prints {"steps_per_s": ...} of STEPS timed steps after
WARMUP untimed ones.

Usage: torch_train.py mlp|cnn MODEL.onnx [--threads T] [--warmup W] [--steps N]
"""
import argparse
import gzip
import json
import time

import numpy as np
import onnx
import torch
from onnx import numpy_helper

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    data = gzip.open(path).read()
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


class Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = torch.nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = torch.nn.Linear(3136, 1024)
        self.fc2 = torch.nn.Linear(1024, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(784, 512), torch.nn.Linear(512, 512), torch.nn.Linear(512, 10)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model", choices=["mlp", "cnn"])
    parser.add_argument("onnx")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = Mlp() if args.model == "mlp" else Cnn()
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(args.onnx).graph.initializer}
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(weights[name].copy()))
    n = (args.warmup + args.steps) * 128
    images = read_idx(f"{DATA}/train-images-idx3-ubyte.gz")
    labels = read_idx(f"{DATA}/train-labels-idx1-ubyte.gz")
    reps = -(-n // len(images))
    x_all = torch.from_numpy(np.tile(images, (reps, 1, 1))[:n].astype(np.float32) / 255)
    x_all = x_all.reshape(n, 784) if args.model == "mlp" else x_all.reshape(n, 1, 28, 28)
    y_all = torch.from_numpy(np.tile(labels, reps)[:n].astype(np.int64))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = time.perf_counter()
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            start = time.perf_counter()
        x, y = x_all[step * 128:(step + 1) * 128], y_all[step * 128:(step + 1) * 128]
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    print(json.dumps({"steps_per_s": args.steps / (time.perf_counter() - start)}))


if __name__ == "__main__":
    main()
