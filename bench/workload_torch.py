#!/usr/bin/env python3
"""PyTorch side of bench/workloads.py: trains one workload of bench/workload_models.py (its
module, optimizer and synthetic batches, held in memory as torch tensors, cycled in order) and
prints {"steps_per_s": ..., "first_loss": the loss of step 1, ...}: STEPS timed steps after WARMUP untimed ones, in one process, so
start-up and the first steps' allocations are left out. --compile wraps the module in
torch.compile (default backend, inductor) first; its compilation happens in the warm-up steps.

Usage: workload_torch.py resnet18|bert|lstm [--threads T] [--warmup K] [--steps M] [--compile]
"""
import argparse
import json
import time

import torch

import workload_models


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=sorted(workload_models.BATCH))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=2, help="at least 1")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batches", type=int, default=4, help="distinct batches in memory, cycled")
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    name = args.workload
    model = workload_models.build(name)
    model.train()
    optimizer = workload_models.OPTIMIZER[name][1](model.parameters())
    step_fn = torch.compile(model) if args.compile else model
    data = {k: torch.from_numpy(v) for k, v in workload_models.dataset(name, args.batches).items()}
    x_all, y_all = data[workload_models.input_name(name)], data["label"]
    batch = workload_models.BATCH[name]

    def step(i):
        j = i % args.batches
        x, y = x_all[j * batch:(j + 1) * batch], y_all[j * batch:(j + 1) * batch]
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(step_fn(x), y)
        loss.backward()
        optimizer.step()
        return loss

    first_loss = step(0).item()
    for i in range(1, args.warmup):
        step(i)
    start = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        loss = step(i)
    rate = args.steps / (time.perf_counter() - start)
    print(json.dumps({"steps_per_s": rate, "first_loss": first_loss, "loss": loss.item()}))


if __name__ == "__main__":
    main()
