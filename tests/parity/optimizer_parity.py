#!/usr/bin/env python3
"""make-trainable's optimizers, parameter groups and schedules against torch.optim in float64.

A float64 MLP (Linear(4, 6), Tanh, Linear(6, 3), cross_entropy) is exported with
torch.onnx.export, made trainable with `onnxtrain make-trainable` and the flags of each case,
and trained for 20 steps on one fixed batch with `onnxtrain step`. PyTorch trains the same
module from the same weights on the same batch with the torch.optim optimizer and the
torch.optim.lr_scheduler scheduler the flags stand for (scheduler.step() after every
optimizer.step()). Must agree, at rtol 1e-6 (atol 1e-12):
- the loss of every step and every parameter after the last step;
- the learning rate of every step: of each group ("onnxtrain.param_groups.K.lr", float64)
  against param_groups[K]["lr"] at rtol 1e-9, or without groups the float32 "onnxtrain.lr"
  at rtol 1e-6 (its float32 rounding);
- a frozen parameter (requires_grad False in PyTorch, --freeze here) stays bit-identical.
Cases: SGD (weight decay, momentum, dampening, nesterov), Adam, AdamW, Adagrad (lr_decay,
initial_accumulator_value: PyTorch 2.13 starts every group's sum at the constructor's value and
ignores a group's own, so the groups case sets it at the top level); each family with two parameter groups of different
hyperparameters and a frozen bias; StepLR, MultiStepLR, ConstantLR, LinearLR, ExponentialLR,
PolynomialLR, CosineAnnealingLR (eta_min > 0, 20 steps past T_max = 8, where PyTorch's rate
rises again), make-trainable's clamped cosine, SequentialLR (LinearLR warm-up, then
CosineAnnealingLR), OneCycleLR (cos and linear, three_phase, per-group max_lr and momenta,
cycle_momentum with SGD momentum, with plain SGD whose momentum PyTorch turns on, with Adam's
beta1, and off with Adagrad). Cases with hyperparameters that float32 holds exactly check that
the program uses the ai.onnx.preview.training op (Momentum, Adam, Adagrad); the others that
it does not (their updates are plain ops). Two cases run in float32 (rtol 1e-5): OneCycle with
Adam's cycled beta1 and Adam with groups (the Adam op). The script prints the largest
relative difference of each case.

Usage: optimizer_parity.py --onnxtrain build/release/src/onnxtrain
"""
import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import onnx
import torch
from onnx import numpy_helper

STEPS = 20
failures = []
optim = torch.optim
sched = torch.optim.lr_scheduler


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(" ".join(cmd) + f" exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout


def make_model(dtype):
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3)).to(dtype)


def batch(dtype):
    g = torch.Generator().manual_seed(11)
    return torch.randn(8, 4, generator=g).to(dtype), torch.arange(8) % 3


def groups(model, specs):
    """torch param_groups: specs = [(names, hyperparameters), ...]."""
    params = dict(model.named_parameters())
    return [dict(params=[params[n] for n in names], **hyper) for names, hyper in specs]


LAYER0 = ["0.weight", "0.bias"]
W2 = ["2.weight"]
G0, G1 = r"0\..*", r"2\.weight"
FREEZE = ["--freeze", r"2\.bias"]


def case(name, cli, factory, frozen=(), ops=None, no_ops=(), dtype=torch.float64, rtol=1e-6):
    return dict(name=name, cli=cli, factory=factory, frozen=list(frozen), ops=ops or {}, no_ops=list(no_ops),
                dtype=dtype, rtol=rtol)


def sgd_groups(m):
    return optim.SGD(groups(m, [(LAYER0, dict(lr=0.2, weight_decay=0.0, momentum=0.5, nesterov=True)),
                                (W2, dict(lr=0.05, weight_decay=0.01, momentum=0.9, dampening=0.1))]),
                     lr=0.1, momentum=0.9)


SGD_GROUPS = ["--optimizer", "momentum", "--lr", "0.1", "--momentum", "0.9",
              "--param-group", G0 + ":lr=0.2,weight_decay=0,momentum=0.5,nesterov=true",
              "--param-group", G1 + ":lr=0.05,weight_decay=0.01,momentum=0.9,dampening=0.1"] + FREEZE


def adam_groups(m, cls=optim.Adam, wd=(0.01, 0.0)):
    return cls(groups(m, [(LAYER0, dict(lr=0.02, betas=(0.8, 0.95), eps=1e-6, weight_decay=wd[0])),
                          (W2, dict(lr=0.005, weight_decay=wd[1]))]), lr=0.01)


def adam_group_flags(optimizer, wd=(0.01, 0.0)):
    return ["--optimizer", optimizer, "--lr", "0.01",
            "--param-group", G0 + f":lr=0.02,beta1=0.8,beta2=0.95,eps=1e-6,weight_decay={wd[0]}",
            "--param-group", G1 + f":lr=0.005,weight_decay={wd[1]}"] + FREEZE


def cosine_clamped(base, eta, total):
    return lambda t: (eta + (base - eta) * (1 + math.cos(math.pi * min(t, total) / total)) / 2) / base


CASES = [
    # Optimizers, one group.
    case("sgd weight_decay", ["--optimizer", "sgd", "--lr", "0.1", "--weight-decay", "0.01"],
         lambda m: optim.SGD(m.parameters(), lr=0.1, weight_decay=0.01), no_ops=["Momentum"]),
    case("sgd momentum dampening", ["--optimizer", "momentum", "--lr", "0.1", "--momentum", "0.9", "--dampening", "0.3",
                                    "--weight-decay", "0.01"],
         lambda m: optim.SGD(m.parameters(), lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.01), no_ops=["Momentum"]),
    case("sgd nesterov", ["--optimizer", "nesterov", "--lr", "0.1", "--momentum", "0.9", "--weight-decay", "0.01"],
         lambda m: optim.SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    case("adam", ["--optimizer", "adam", "--lr", "0.01", "--beta1", "0.8", "--beta2", "0.99", "--eps", "1e-6",
                  "--weight-decay", "0.01"],
         lambda m: optim.Adam(m.parameters(), lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01), no_ops=["Adam"]),
    case("adamw", ["--optimizer", "adamw", "--lr", "0.01", "--weight-decay", "0.1"],
         lambda m: optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.1)),
    case("adagrad", ["--optimizer", "adagrad", "--lr", "0.1", "--lr-decay", "0.05", "--initial-accumulator-value", "0.1",
                     "--eps", "1e-8", "--weight-decay", "0.01"],
         lambda m: optim.Adagrad(m.parameters(), lr=0.1, lr_decay=0.05, initial_accumulator_value=0.1, eps=1e-8,
                                 weight_decay=0.01), no_ops=["Adagrad"]),
    # Hyperparameters float32 holds exactly: the ai.onnx.preview.training ops, in float64.
    case("sgd momentum, exact attributes (Momentum op)",
         ["--optimizer", "nesterov", "--lr", "0.1", "--momentum", "0.5", "--weight-decay", "0.125"],
         lambda m: optim.SGD(m.parameters(), lr=0.1, momentum=0.5, nesterov=True, weight_decay=0.125),
         ops={"Momentum": 1}),
    case("sgd dampening, exact attributes (Momentum op)",
         ["--optimizer", "momentum", "--lr", "0.1", "--momentum", "0.5", "--dampening", "0.25"],
         lambda m: optim.SGD(m.parameters(), lr=0.1, momentum=0.5, dampening=0.25), ops={"Momentum": 1}),
    case("adamw, exact attributes (Adam op)",
         ["--optimizer", "adamw", "--lr", "0.01", "--beta1", "0.75", "--beta2", "0.9375", "--eps", str(2.0 ** -20),
          "--weight-decay", "0.1"],
         lambda m: optim.AdamW(m.parameters(), lr=0.01, betas=(0.75, 0.9375), eps=2.0 ** -20, weight_decay=0.1),
         ops={"Adam": 1}),
    case("adagrad, exact attributes (Adagrad op)",
         ["--optimizer", "adagrad", "--lr", "0.1", "--lr-decay", "0.0625", "--eps", str(2.0 ** -20), "--weight-decay",
          "0.125", "--initial-accumulator-value", "0.1"],
         lambda m: optim.Adagrad(m.parameters(), lr=0.1, lr_decay=0.0625, eps=2.0 ** -20, weight_decay=0.125,
                                 initial_accumulator_value=0.1), ops={"Adagrad": 1}),
    # Two parameter groups and a frozen parameter.
    case("sgd 2 groups", SGD_GROUPS, sgd_groups, frozen=["2.bias"]),
    case("adam 2 groups", adam_group_flags("adam"), adam_groups, frozen=["2.bias"]),
    case("adamw 2 groups", adam_group_flags("adamw", (0.1, 0.02)), lambda m: adam_groups(m, optim.AdamW, (0.1, 0.02)),
         frozen=["2.bias"]),
    case("adagrad 2 groups",
         ["--optimizer", "adagrad", "--lr", "0.1", "--initial-accumulator-value", "0.5",
          "--param-group", G0 + ":lr=0.2,lr_decay=0.1,eps=1e-6", "--param-group", G1 + ":weight_decay=0.01"] + FREEZE,
         lambda m: optim.Adagrad(groups(m, [(LAYER0, dict(lr=0.2, lr_decay=0.1, eps=1e-6)), (W2, dict(weight_decay=0.01))]),
                                 lr=0.1, initial_accumulator_value=0.5), frozen=["2.bias"]),
    case("float32 adam 2 groups (Adam op)", adam_group_flags("adam"), adam_groups, frozen=["2.bias"], ops={"Adam": 2},
         dtype=torch.float32, rtol=1e-5),
    # Schedules.
    case("StepLR", ["--optimizer", "momentum", "--lr", "0.1", "--lr-schedule", "step", "--step-size", "6", "--gamma", "0.5"],
         lambda m: (o := optim.SGD(m.parameters(), lr=0.1, momentum=0.9), sched.StepLR(o, step_size=6, gamma=0.5))),
    case("MultiStepLR 2 groups", SGD_GROUPS + ["--lr-schedule", "multistep", "--milestones", "5,12,12", "--gamma", "0.5"],
         lambda m: (o := sgd_groups(m), sched.MultiStepLR(o, milestones=[5, 12, 12], gamma=0.5)), frozen=["2.bias"]),
    case("ConstantLR", ["--optimizer", "adam", "--lr", "0.01", "--lr-schedule", "constant", "--factor", "0.5",
                        "--total-iters", "4"],
         lambda m: (o := optim.Adam(m.parameters(), lr=0.01), sched.ConstantLR(o, factor=0.5, total_iters=4))),
    case("LinearLR", ["--optimizer", "adam", "--lr", "0.01", "--lr-schedule", "linear", "--start-factor", "0.25",
                      "--end-factor", "1", "--total-iters", "10"],
         lambda m: (o := optim.Adam(m.parameters(), lr=0.01),
                    sched.LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=10))),
    case("ExponentialLR", ["--optimizer", "nesterov", "--lr", "0.1", "--lr-schedule", "exponential", "--gamma", "0.9"],
         lambda m: (o := optim.SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True), sched.ExponentialLR(o, gamma=0.9))),
    case("PolynomialLR", ["--optimizer", "adagrad", "--lr", "0.1", "--lr-schedule", "polynomial", "--total-iters", "15",
                          "--power", "2"],
         lambda m: (o := optim.Adagrad(m.parameters(), lr=0.1), sched.PolynomialLR(o, total_iters=15, power=2.0))),
    case("CosineAnnealingLR eta_min, AdamW 2 groups",
         adam_group_flags("adamw", (0.1, 0.02)) + ["--lr-schedule", "cosine_annealing", "--t-max", "8", "--eta-min", "0.001"],
         lambda m: (o := adam_groups(m, optim.AdamW, (0.1, 0.02)), sched.CosineAnnealingLR(o, T_max=8, eta_min=0.001)),
         frozen=["2.bias"]),
    case("cosine held after total_steps, eta_min",
         ["--optimizer", "adamw", "--lr", "0.01", "--weight-decay", "0.1", "--lr-schedule", "cosine", "--total-steps", "12",
          "--eta-min", "0.002"],
         lambda m: (o := optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.1),
                    sched.LambdaLR(o, cosine_clamped(0.01, 0.002, 12)))),
    case("SequentialLR warm-up then cosine, 2 groups",
         SGD_GROUPS + ["--lr-schedule", "sequential", "--scheduler", "linear:start_factor=0.1,end_factor=1,total_iters=5",
                       "--scheduler", "cosine_annealing:T_max=15,eta_min=0.001", "--milestones", "5"],
         lambda m: (o := sgd_groups(m), sched.SequentialLR(o, [sched.LinearLR(o, start_factor=0.1, end_factor=1.0, total_iters=5),
                                                               sched.CosineAnnealingLR(o, T_max=15, eta_min=0.001)],
                                                           milestones=[5])),
         frozen=["2.bias"]),
    case("SequentialLR of three", ["--optimizer", "adam", "--lr", "0.01", "--lr-schedule", "sequential",
                                   "--scheduler", "constant:factor=0.5,total_iters=2", "--scheduler", "exponential:gamma=0.8",
                                   "--scheduler", "multistep:milestones=2,4,gamma=0.5", "--milestones", "4,9"],
         lambda m: (o := optim.Adam(m.parameters(), lr=0.01),
                    sched.SequentialLR(o, [sched.ConstantLR(o, factor=0.5, total_iters=2), sched.ExponentialLR(o, gamma=0.8),
                                           sched.MultiStepLR(o, milestones=[2, 4], gamma=0.5)], milestones=[4, 9]))),
    # OneCycleLR.
    case("OneCycleLR cos, SGD momentum cycled",
         ["--optimizer", "momentum", "--momentum", "0.9", "--lr-schedule", "onecycle", "--max-lr", "0.2", "--total-steps", "20"],
         lambda m: (o := optim.SGD(m.parameters(), lr=0.1, momentum=0.9), sched.OneCycleLR(o, max_lr=0.2, total_steps=20)),
         no_ops=["Momentum"]),
    case("OneCycleLR, plain SGD (PyTorch turns momentum on)",
         ["--optimizer", "sgd", "--dampening", "0.2", "--lr-schedule", "onecycle", "--max-lr", "0.3", "--total-steps", "24"],
         lambda m: (o := optim.SGD(m.parameters(), lr=0.1, dampening=0.2), sched.OneCycleLR(o, max_lr=0.3, total_steps=24))),
    case("OneCycleLR three_phase, Adam beta1 cycled, max_lr per group",
         ["--optimizer", "adam", "--lr", "0.01", "--param-group", G0 + ":beta2=0.95,eps=1e-6,weight_decay=0.01",
          "--param-group", G1 + ":weight_decay=0", "--param-group", r"2\.bias:max_lr=0.03",
          "--lr-schedule", "onecycle", "--max-lr", "0.01", "--total-steps", "20", "--three-phase"],
         lambda m: (o := optim.Adam(groups(m, [(LAYER0, dict(betas=(0.9, 0.95), eps=1e-6, weight_decay=0.01)),
                                               (W2, dict(weight_decay=0.0)), (["2.bias"], {})]), lr=0.01),
                    sched.OneCycleLR(o, max_lr=[0.01, 0.01, 0.03], total_steps=20, three_phase=True)),
         no_ops=["Adam"]),
    case("OneCycleLR linear, nesterov, momenta per group",
         ["--optimizer", "momentum", "--lr", "0.1", "--momentum", "0.9",
          "--param-group", r"0\.weight:weight_decay=0,momentum=0.5,nesterov=true",
          "--param-group", G1 + ":weight_decay=0.01,dampening=0.1",
          "--param-group", r"0\.bias:base_momentum=0.7,max_momentum=0.9,max_lr=0.4",
          "--lr-schedule", "onecycle", "--anneal-strategy", "linear", "--max-lr", "0.2", "--total-steps", "20",
          "--pct-start", "0.25", "--div-factor", "10", "--final-div-factor", "100"] + FREEZE,
         lambda m: (o := optim.SGD(groups(m, [(["0.weight"], dict(weight_decay=0.0, momentum=0.5, nesterov=True)),
                                              (W2, dict(weight_decay=0.01, dampening=0.1)),
                                              (["0.bias"], {})]), lr=0.1, momentum=0.9),
                    sched.OneCycleLR(o, max_lr=[0.2, 0.2, 0.4], total_steps=20, anneal_strategy="linear", pct_start=0.25,
                                     div_factor=10, final_div_factor=100, base_momentum=[0.85, 0.85, 0.7],
                                     max_momentum=[0.95, 0.95, 0.9])),
         frozen=["2.bias"]),
    case("OneCycleLR without cycle_momentum, Adagrad",
         ["--optimizer", "adagrad", "--lr-schedule", "onecycle", "--max-lr", "0.3", "--total-steps", "20",
          "--no-cycle-momentum"],
         lambda m: (o := optim.Adagrad(m.parameters(), lr=0.1), sched.OneCycleLR(o, max_lr=0.3, total_steps=20,
                                                                                 cycle_momentum=False))),
    case("float32 OneCycleLR, Adam beta1 cycled",
         ["--optimizer", "adam", "--lr-schedule", "onecycle", "--max-lr", "0.02", "--total-steps", "20"],
         lambda m: (o := optim.Adam(m.parameters(), lr=0.01), sched.OneCycleLR(o, max_lr=0.02, total_steps=20)),
         dtype=torch.float32, rtol=1e-5, no_ops=["Adam"]),
]


def rel(got, want):
    return float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-300)))


def exported(workdir, dtype):
    """The model exported to WORKDIR/<dtype>.onnx and its batch as .npy files."""
    stem = str(dtype).split(".")[-1]
    path = os.path.join(workdir, stem + ".onnx")
    x, label = batch(dtype)
    if not os.path.exists(path):
        torch.onnx.export(make_model(dtype), (x,), path, dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["y"], do_constant_folding=False)
        np.save(os.path.join(workdir, stem + "_x.npy"), x.numpy())
        np.save(os.path.join(workdir, "label.npy"), label.numpy())
    return path, os.path.join(workdir, stem + "_x.npy"), os.path.join(workdir, "label.npy")


def op_counts(model_path):
    counts = {}
    for n in onnx.load(model_path).training_info[0].algorithm.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


def torch_run(c):
    model = make_model(c["dtype"])
    x, label = batch(c["dtype"])
    for name, p in model.named_parameters():
        if name in c["frozen"]:
            p.requires_grad_(False)
    made = c["factory"](model)
    optimizer, scheduler = made if isinstance(made, tuple) else (made, None)
    losses, lrs = [], []
    for _ in range(STEPS):
        lrs.append([g["lr"] for g in optimizer.param_groups])
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), label)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return model, np.array(losses), np.array(lrs)


def check(onnxtrain, workdir, c):
    path, x_path, label_path = exported(workdir, c["dtype"])
    trainable = os.path.join(workdir, "trainable.onnx")
    trained = os.path.join(workdir, "trained.onnx")
    run([onnxtrain, "make-trainable", path, "-o", trainable] + c["cli"])
    counts = op_counts(trainable)
    for op, n in c["ops"].items():
        if counts.get(op, 0) != n:
            return f"expected {n} {op} node(s), found {counts.get(op, 0)}"
    for op in c["no_ops"]:
        if counts.get(op, 0):
            return f"expected plain ops, found {counts[op]} {op} node(s)"
    out = run([onnxtrain, "step", trainable, "--input", "x=" + x_path, "--input", "label=" + label_path,
               "--steps", str(STEPS), "-o", trained])
    got_losses = np.array([float(v) for v in re.findall(r"onnxtrain\.loss=(\S+)", out)])
    group_lrs = {}
    for k, v in re.findall(r"onnxtrain\.param_groups\.(\d+)\.lr=(\S+)", out):
        group_lrs.setdefault(int(k), []).append(float(v))
    display_lr = np.array([float(v) for v in re.findall(r"onnxtrain\.lr=(\S+)", out)])
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(trained).graph.initializer}
    initial = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}

    model, want_losses, want_lrs = torch_run(c)
    rtol, atol = c["rtol"], 1e-12 if c["dtype"] == torch.float64 else 1e-7
    if len(got_losses) != STEPS or not np.allclose(got_losses, want_losses, rtol=rtol, atol=atol):
        return f"losses differ: onnxtrain {got_losses[:2]}...{got_losses[-1:]}, torch {want_losses[:2]}...{want_losses[-1:]}"
    worst = rel(got_losses, want_losses)
    if group_lrs:
        for k in range(want_lrs.shape[1]):
            got = np.array(group_lrs.get(k, []))
            if len(got) != STEPS or not np.allclose(got, want_lrs[:, k], rtol=1e-9, atol=0):
                return f"param_groups[{k}] learning rates differ: onnxtrain {got}, torch {want_lrs[:, k]}"
    elif len(display_lr) != STEPS or not np.allclose(display_lr, want_lrs[:, 0], rtol=1e-6, atol=0):
        return f"learning rates differ: onnxtrain {display_lr}, torch {want_lrs[:, 0]}"
    for name, p in model.named_parameters():
        want = p.detach().numpy()
        if name in c["frozen"]:
            if weights[name].tobytes() != initial[name].tobytes() or want.tobytes() != initial[name].tobytes():
                return f"frozen {name} changed"
            continue
        if np.array_equal(weights[name], initial[name]):
            return f"{name} did not train"
        if not np.allclose(weights[name], want, rtol=rtol, atol=atol):
            return f"{name} differs: max relative difference {rel(weights[name], want):.3g}"
        worst = max(worst, rel(weights[name], want))
    print(f"ok   {c['name']}: {STEPS} steps, loss {want_losses[0]:.4f} -> {want_losses[-1]:.4f}, "
          f"max relative difference {worst:.2g} (rtol {rtol:g})")
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnxtrain", required=True)
    parser.add_argument("-k", default="", help="run only the cases whose name contains this")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # the TorchScript exporter
    with tempfile.TemporaryDirectory() as workdir:
        for c in CASES:
            if args.k not in c["name"]:
                continue
            try:
                problem = check(args.onnxtrain, workdir, c)
            except Exception as e:  # a failed command or a torch error
                problem = str(e)
            if problem:
                failures.append(c["name"])
                print(f"FAIL {c['name']}: {problem}")
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
