#!/usr/bin/env python3
"""ZeRO stage 1 (issue 17, docs/distributed.md "ZeRO-1"): `mpirun -np 2 onnxtrain train
--shard-optimizer-state` against 2 ranks without it and against one process, on the Fashion-MNIST
MLP (examples/fashion_mnist/make_model.py) with the synthetic data of equivalence.py (20 steps of
a global batch of 128, the last of 100), for Adam, SGD with momentum (the ONNX Momentum op) and
AdamW (decoupled weight decay):

- sharded vs plain, 2 ranks: every initializer of the written model (the parameters AND the
  optimizer state in training_info, AND the step counter) bit-identical. Why exactly: both
  average the same gradients in the same allreduce; the owner of a parameter runs the same
  element-wise optimizer kernel on it as every rank does unsharded (the multi-tensor node
  restricted to its tensors computes each tensor from its own inputs only, ONNX spec), and
  the broadcast copies bytes.
- sharded vs one process: every parameter tensor within rtol 1e-5 norm-wise, as equivalence.py
  measures (and for the reasons it gives: the split batch rounds the gradient differently).
- memory: each rank prints `rank R of N: holds B bytes of variables`. Plain ranks hold every
  variable; sharded, the optimizer state (the training_info's non-scalar variables) is held
  exactly once across the ranks, each rank holds less of it than a plain rank, and no rank
  holds more than 1/N of it plus one parameter's state (the greedy partition by whole tensor
  can be off by at most the largest tensor).
- resume: a sharded run stopped by --max-steps 10 (checkpoint every 5 steps) and resumed from
  its checkpoint equals the uninterrupted sharded run bit-identically (every initializer).
- --shard-optimizer-state without mpirun is an error naming the option; a hand-written update
  that reads another parameter's optimizer state (the new Adam m of fc3.weight plus 0 times the
  sum of fc1.weight's m) is an error naming the node, on the rank that cannot run it, and no
  output is written.
- with --memory (not in ctest: slow), peak RSS per rank (VmHWM) of plain vs sharded on a wider
  MLP 784-2048-2048-2048-10 with Adam (optimizer state twice the parameters).
Skipped (exit 77, ctest SKIP_RETURN_CODE) without mpirun.

Usage: zero.py --onnxtrain PATH [--memory]
"""
import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

from equivalence import mpi_setup, run, variables  # this folder is on sys.path (the script's own)

HERE = os.path.dirname(os.path.abspath(__file__))
MAKE_MODEL = os.path.join(HERE, "..", "..", "examples", "fashion_mnist", "make_model.py")
STEPS = 20
BATCH = 128
OPTIMIZERS = {
    "adam": ["--optimizer", "adam", "--lr", "1e-3"],
    "momentum": ["--optimizer", "momentum", "--lr", "0.05", "--momentum", "0.9"],
    "adamw": ["--optimizer", "adamw", "--lr", "1e-3", "--weight-decay", "0.01"],
}


def state_sizes(path):
    """(bytes of the parameters, of the optimizer state, of the scalar variables, the largest
    parameter's bytes) of a trainable model: the update_binding keys, split by where they live."""
    model = onnx.load(path)
    keys = {b.key for info in model.training_info for b in info.update_binding}
    params = {t.name: numpy_helper.to_array(t).nbytes for t in model.graph.initializer if t.name in keys}
    state = scalars = 0
    for info in model.training_info:
        for t in info.algorithm.initializer:
            if t.name in keys:
                a = numpy_helper.to_array(t)
                if a.size == 1:
                    scalars += a.nbytes
                else:
                    state += a.nbytes
    return sum(params.values()), state, scalars, max(params.values())


def held(text):
    """{rank: (bytes held, current RSS MiB, peak RSS MiB)} from the ranks' memory lines."""
    found = {}
    for m in re.finditer(r"rank (\d+) of \d+: holds (\d+) bytes of variables[^;\n]*; current RSS ([\d.]+) MiB, "
                         r"peak RSS ([\d.]+) MiB", text):
        found[int(m.group(1))] = (int(m.group(2)), float(m.group(3)), float(m.group(4)))
    return found


def compare_exact(label, a, b):
    failures = 0
    if sorted(a) != sorted(b):
        print(f"{label}: FAIL: different initializers {sorted(set(a) ^ set(b))}")
        return 1
    differing = [n for n in sorted(a) if not np.array_equal(a[n], b[n])]
    print(f"{label}: {len(a)} initializers, {'all bit-identical ok' if not differing else 'FAIL: differ: ' + str(differing)}")
    return 1 if differing else failures


def wide_mlp(path):
    spec = importlib.util.spec_from_file_location("make_model", MAKE_MODEL)
    mm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mm)
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    mm.linear(rng, nodes, inits, "fc1", "x", 784, 2048, "h1")
    nodes.append(helper.make_node("Relu", ["h1"], ["a1"]))
    mm.linear(rng, nodes, inits, "fc2", "a1", 2048, 2048, "h2")
    nodes.append(helper.make_node("Relu", ["h2"], ["a2"]))
    mm.linear(rng, nodes, inits, "fc3", "a2", 2048, 2048, "h3")
    nodes.append(helper.make_node("Relu", ["h3"], ["a3"]))
    mm.linear(rng, nodes, inits, "fc4", "a3", 2048, 10, "logits")
    onnx.save(mm.model(helper.make_graph(nodes, "wide_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 784])],
                                         [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)), path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--onnxtrain", required=True)
    parser.add_argument("--memory", action="store_true", help="also report peak RSS on MLP 784-2048-2048-2048-10")
    args = parser.parse_args()
    setup = mpi_setup()
    if setup is None:
        return 77
    mpirun, env = setup
    mpi = lambda n: [mpirun, "-np", str(n), "--oversubscribe", args.onnxtrain]
    failures = 0
    rng = np.random.default_rng(17)
    samples = BATCH * (STEPS - 1) + 100
    with tempfile.TemporaryDirectory() as d:
        p = lambda name: os.path.join(d, name)
        np.savez(p("data.npz"), image=rng.integers(0, 256, (samples, 784), dtype=np.uint8),
                 label=rng.integers(0, 10, samples, dtype=np.int64))
        run([sys.executable, MAKE_MODEL, d])
        for opt, flags in OPTIMIZERS.items():
            model = p(f"{opt}.onnx")
            run([args.onnxtrain, "make-trainable", p("mlp.onnx"), "-o", model, "--loss", "cross_entropy"] + flags)
            common = ["train", model, "--data", p("data.npz"), "--map", "x=image", "--scale", "image=1/255",
                      "--batch-size", str(BATCH), "--epochs", "1", "--seed", "3", "--threads", "1"]
            run([args.onnxtrain] + common + ["-q", "-o", p(f"{opt}_one.onnx")])
            plain_out = run(mpi(2) + common + ["-o", p(f"{opt}_plain.onnx")], env)
            zero_out = run(mpi(2) + common + ["--shard-optimizer-state", "-o", p(f"{opt}_zero.onnx")], env)
            one, plain, zero = (variables(p(f"{opt}_{k}.onnx")) for k in ("one", "plain", "zero"))
            failures += compare_exact(f"{opt}: 2 ranks sharded vs plain", zero, plain)
            initial = variables(p("mlp.onnx"))
            worst = max(np.linalg.norm(zero[n] - one[n]) / np.linalg.norm(one[n]) for n in initial)
            moved = min(np.abs(zero[n] - initial[n]).max() for n in initial)
            ok = worst <= 1e-5 and moved > 0
            print(f"{opt}: sharded vs 1 process: largest |w_2 - w_1|/|w_1| {worst:.3g} (every tensor moved) {'ok' if ok else 'FAIL'}")
            failures += not ok

            params, state, scalars, largest = state_sizes(model)
            per_param_state = state * largest / params  # the state is proportional to the parameters
            hp, hz = held(plain_out), held(zero_out)
            ok = sorted(hp) == [0, 1] and sorted(hz) == [0, 1] and all(hp[r][0] == params + state + scalars for r in hp)
            shards = {r: hz[r][0] - params - scalars for r in hz} if ok else {}
            ok = ok and sum(shards.values()) == state and all(0 <= s < state and s <= state / 2 + per_param_state for s in shards.values())
            print(f"{opt}: optimizer state {state} bytes; plain ranks hold {[hp.get(r, (None,))[0] for r in (0, 1)]} bytes of variables, "
                  f"sharded {[hz.get(r, (None,))[0] for r in (0, 1)]}: optimizer state per rank {[shards.get(r) for r in (0, 1)]} "
                  f"{'ok' if ok else 'FAIL'}")
            failures += not ok

            if opt == "adam":  # resume: stopped at step 10, resumed, equals the uninterrupted run
                run(mpi(2) + common + ["-q", "--shard-optimizer-state", "--max-steps", "10", "--checkpoint-every", "5",
                                       "-o", p("part.onnx")], env)
                run(mpi(2) + common[:2] + ["--resume", p("part.ckpt.onnx")] + common[2:] +
                    ["-q", "--shard-optimizer-state", "-o", p("resumed.onnx")], env)
                failures += compare_exact("adam: sharded, stopped at step 10 and resumed vs uninterrupted",
                                          variables(p("resumed.onnx")), zero)

        failed = subprocess.run([args.onnxtrain, "train", p("adam.onnx"), "--data", p("data.npz"), "--map", "x=image",
                                 "--shard-optimizer-state", "-q", "-o", p("never.onnx")], capture_output=True, text=True)
        ok = failed.returncode != 0 and "--shard-optimizer-state" in failed.stderr and "mpirun" in failed.stderr
        ok = ok and not os.path.exists(p("never.onnx"))
        print(f"without mpirun: {'ok' if ok else 'FAIL: ' + failed.stdout + failed.stderr}")
        failures += not ok

        mixed = onnx.load(p("adam.onnx"))
        info = mixed.training_info[0]
        binding = next(b for b in info.update_binding if b.key == "onnxtrain.adam_m.fc3.weight")
        info.algorithm.initializer.append(numpy_helper.from_array(np.array(0, np.float32), "mix.zero"))
        info.algorithm.node.extend([
            helper.make_node("ReduceSum", ["onnxtrain.adam_m.fc1.weight"], ["mix.sum"], keepdims=0, name="mix_sum"),
            helper.make_node("Mul", ["mix.sum", "mix.zero"], ["mix.nothing"], name="mix_scale"),
            helper.make_node("Add", [binding.value, "mix.nothing"], ["mix.m"], name="mix_add")])
        old = [o for o in info.algorithm.output if o.name == binding.value]
        for o in old:  # no longer an output: only the rank owning fc3.weight computes it
            info.algorithm.output.remove(o)
        info.algorithm.output.append(helper.make_tensor_value_info("mix.m", TensorProto.FLOAT, [10, 512]))
        binding.value = "mix.m"
        onnx.save(mixed, p("mixed.onnx"))
        failed = subprocess.run(mpi(2) + ["train", p("mixed.onnx"), "--data", p("data.npz"), "--map", "x=image",
                                          "--shard-optimizer-state", "-q", "-o", p("never.onnx")],
                                capture_output=True, text=True, env=env, timeout=120)
        ok = failed.returncode != 0 and "mix_sum" in failed.stderr and "onnxtrain.adam_m.fc1.weight" in failed.stderr
        ok = ok and not os.path.exists(p("never.onnx"))
        said = next((l for l in failed.stderr.splitlines() if l.startswith("error:")), "")
        print(f"an update mixing two parameters' state: {said}: {'ok' if ok else 'FAIL: ' + failed.stdout + failed.stderr}")
        failures += not ok
        run(mpi(2) + ["train", p("mixed.onnx"), "--data", p("data.npz"), "--map", "x=image", "-q", "--max-steps", "2",
                      "-o", p("mixed_plain.onnx")], env)  # the same model trains unsharded

        if args.memory:
            wide_mlp(p("wide.onnx"))
            run([args.onnxtrain, "make-trainable", p("wide.onnx"), "-o", p("wide_train.onnx"), "--loss", "cross_entropy",
                 "--optimizer", "adam"])
            params, state, scalars, _ = state_sizes(p("wide_train.onnx"))
            common = ["train", p("wide_train.onnx"), "--data", p("data.npz"), "--map", "x=image", "--scale", "image=1/255",
                      "--batch-size", str(BATCH), "--epochs", "1", "--seed", "3", "--threads", "1", "--max-steps", "5"]
            print(f"MLP 784-2048-2048-2048-10, Adam: parameters {params / 2**20:.1f} MiB, optimizer state {state / 2**20:.1f} MiB")
            for label, extra in (("plain", []), ("sharded", ["--shard-optimizer-state"])):
                for r, (b, rss, peak) in sorted(held(run(mpi(2) + common + extra + ["-o", p(f"wide_{label}.onnx")], env)).items()):
                    print(f"  {label}, rank {r}: variables {b / 2**20:.1f} MiB, RSS at the end {rss:.1f} MiB, peak RSS {peak:.1f} MiB")
    print("PASS" if failures == 0 else f"FAIL: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
