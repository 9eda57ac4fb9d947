#!/usr/bin/env python3
"""make-trainable parity with PyTorch: every loss x optimizer, and every learning-rate schedule.

For each loss (cross_entropy, nll, mse, l1, bce_with_logits) and optimizer (sgd, momentum,
nesterov, adagrad, adam, adamw): a small MLP is exported with torch.onnx.export, made
trainable with `onnxtrain make-trainable`, and trained for 20 steps on one batch with
`onnxtrain step`; PyTorch trains the same model from the same weights on the same batch with
torch.optim. The loss of every step and the final weights must agree (rtol 1e-4, atol 1e-6).
Each schedule (constant, step, exponential, cosine, linear, and linear warm-up) is compared
with torch.optim.lr_scheduler over 100 steps through the learning rate the algorithm outputs.
Frozen parameters (--freeze) must stay bit-identical.
Models of older and newer opsets: cross_entropy x momentum and x adam also run on the model
exported at opsets 7 and 9 (make-trainable upgrades them to 13 with ONNX's version converter;
opset 7 is IR version 3) and at opset 21 (the program's ops at their newer versions).

Usage: make_trainable_parity.py --onnxtrain build/release/src/onnxtrain
"""
import argparse
import math
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import torch
from onnx import numpy_helper

RTOL, ATOL = 1e-4, 1e-6
STEPS = 20
LR = 0.05
failures = []


def fail(message):
    failures.append(message)
    print("FAIL " + message)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(" ".join(cmd) + f" exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout


def step_outputs(stdout, name):
    """The per-step values of one scalar output, from `onnxtrain step`'s lines."""
    return [float(m.group(1)) for m in re.finditer(re.escape(name) + r"=(\S+)", stdout)]


def make_model(loss):
    torch.manual_seed(3)
    out = {"cross_entropy": 3, "nll": 3, "mse": 2, "l1": 2, "bce_with_logits": 2}[loss]
    layers = [torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, out)]
    if loss == "nll":
        layers.append(torch.nn.LogSoftmax(dim=1))
    return torch.nn.Sequential(*layers)


def batch(loss):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(8, 4, generator=g)
    if loss in ("cross_entropy", "nll"):
        return x, torch.arange(8) % 3
    if loss == "bce_with_logits":
        return x, (torch.rand(8, 2, generator=g) > 0.5).float()
    return x, torch.randn(8, 2, generator=g)


def torch_loss(loss, y, label):
    f = torch.nn.functional
    return {"cross_entropy": f.cross_entropy, "nll": f.nll_loss, "mse": f.mse_loss, "l1": f.l1_loss,
            "bce_with_logits": f.binary_cross_entropy_with_logits}[loss](y, label)


def torch_optimizer(name, params, onnx_definition=False):
    if name == "sgd":
        return torch.optim.SGD(params, lr=LR, weight_decay=0.01)
    if name == "momentum":
        return torch.optim.SGD(params, lr=LR, momentum=0.9)
    if name == "nesterov":
        return torch.optim.SGD(params, lr=LR, momentum=0.9, nesterov=True)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=LR)
    if name == "adam":
        return torch.optim.Adam(params, lr=LR)
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.01)


def cli_optimizer(name):
    args = ["--optimizer", name, "--lr", str(LR)]
    if name in ("sgd", "adamw"):
        args += ["--weight-decay", "0.01"]
    return args


def export(model, x, path, opset=17):
    torch.onnx.export(model, (x,), path, dynamo=False, opset_version=min(opset, 20), input_names=["x"],
                      output_names=["y"], do_constant_folding=False)
    if opset > 20:  # beyond the TorchScript exporter's range: the same ops, imported at `opset`
        m = onnx.load(path)
        for o in m.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = opset
        m.ir_version = max(m.ir_version, 10)
        onnx.save(m, path)


def check_loss_optimizer(onnxtrain, workdir, loss, opt, opset=17):
    model = make_model(loss)
    x, label = batch(loss)
    path = os.path.join(workdir, f"{loss}.onnx")
    export(model, x, path, opset)
    np.save(os.path.join(workdir, "x.npy"), x.numpy())
    np.save(os.path.join(workdir, "label.npy"), label.numpy())
    trainable = os.path.join(workdir, f"{loss}_{opt}.onnx")
    trained = os.path.join(workdir, f"{loss}_{opt}_trained.onnx")
    run([onnxtrain, "make-trainable", path, "-o", trainable, "--loss", loss] + cli_optimizer(opt))
    out = run([onnxtrain, "step", trainable, "--input", "x=" + os.path.join(workdir, "x.npy"),
               "--input", "label=" + os.path.join(workdir, "label.npy"), "--steps", str(STEPS), "-o", trained])
    got_losses = step_outputs(out, "onnxtrain.loss")
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(trained).graph.initializer}
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}

    references = [(False, RTOL, ATOL)]
    for onnx_definition, rtol, atol in references:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(initial[n])
        optimizer = torch_optimizer(opt, model.parameters(), onnx_definition)
        want_losses = []
        for _ in range(STEPS):
            optimizer.zero_grad()
            value = torch_loss(loss, model(x), label)
            want_losses.append(value.item())
            value.backward()
            optimizer.step()
        reference = "the ONNX definition" if onnx_definition else "torch.optim"
        label_text = f"{loss} x {opt} at opset {opset} against {reference} (rtol {rtol:g})"
        if len(got_losses) != STEPS or not np.allclose(got_losses, want_losses, rtol=rtol, atol=atol):
            fail(f"{label_text}: losses differ\n  onnxtrain {got_losses[:3]}...{got_losses[-1:]}\n"
                 f"  torch     {want_losses[:3]}...{want_losses[-1:]}")
            return
        for name, p in model.named_parameters():
            diff = np.max(np.abs(weights[name] - p.detach().numpy()))
            if not np.allclose(weights[name], p.detach().numpy(), rtol=rtol, atol=atol):
                fail(f"{label_text}: weight {name} differs by {diff:.3g}")
                return
        print(f"ok   {label_text}: {STEPS} steps, losses {want_losses[0]:.4f} -> {want_losses[-1]:.4f}")


SCHEDULES = {
    # name: (make-trainable options, a torch scheduler factory)
    "constant": ([], lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda t: 1.0)),
    "step": (["--lr-schedule", "step", "--step-size", "7", "--gamma", "0.5"],
             lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5)),
    "exponential": (["--lr-schedule", "exponential", "--gamma", "0.97"],
                    lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.97)),
    "cosine": (["--lr-schedule", "cosine", "--total-steps", "60"],
               lambda o: torch.optim.lr_scheduler.LambdaLR(
                   o, lambda t: 0.5 * (1 + math.cos(math.pi * min(t, 60) / 60)))),
    "cosine_annealing": (["--lr-schedule", "cosine", "--total-steps", "100"],
                         lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=100)),
    "linear": (["--lr-schedule", "linear", "--total-steps", "80"],
               lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=1.0, end_factor=0.0, total_iters=80)),
    "warmup": (["--warmup-steps", "10"], lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda t: min(1.0, (t + 1) / 10))),
}


def exported_mse_model(workdir, stem):
    """The mse model exported to WORKDIR/STEM.onnx, its batch saved as x.npy and label.npy."""
    model = make_model("mse")
    x, label = batch("mse")
    path = os.path.join(workdir, stem + ".onnx")
    export(model, x, path)
    np.save(os.path.join(workdir, "x.npy"), x.numpy())
    np.save(os.path.join(workdir, "label.npy"), label.numpy())
    return model, path


def check_schedule(onnxtrain, workdir, name, options, factory):
    steps = 100
    model, path = exported_mse_model(workdir, "schedule")
    trainable = os.path.join(workdir, f"schedule_{name}.onnx")
    run([onnxtrain, "make-trainable", path, "-o", trainable, "--loss", "mse", "--lr", "0.1"] + options)
    out = run([onnxtrain, "step", trainable, "--input", "x=" + os.path.join(workdir, "x.npy"),
               "--input", "label=" + os.path.join(workdir, "label.npy"), "--steps", str(steps),
               "-o", os.path.join(workdir, "schedule_trained.onnx")])
    got = step_outputs(out, "onnxtrain.lr")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = factory(optimizer)
    want = []
    for _ in range(steps):
        want.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    if len(got) != steps or not np.allclose(got, want, rtol=RTOL, atol=1e-7):
        worst = int(np.argmax(np.abs(np.array(got[:steps]) - np.array(want[:len(got)])))) if got else 0
        fail(f"schedule {name}: learning rates differ (step {worst}: onnxtrain {got[worst] if got else None}, "
             f"torch {want[worst]})")
    else:
        print(f"ok   schedule {name}: {steps} learning rates match torch.optim.lr_scheduler")


def check_freeze(onnxtrain, workdir):
    _, path = exported_mse_model(workdir, "freeze")
    trainable = os.path.join(workdir, "freeze_trainable.onnx")
    trained = os.path.join(workdir, "freeze_trained.onnx")
    run([onnxtrain, "make-trainable", path, "-o", trainable, "--loss", "mse", "--optimizer", "adam",
         "--freeze", r"0\..*"])
    run([onnxtrain, "step", trainable, "--input", "x=" + os.path.join(workdir, "x.npy"),
         "--input", "label=" + os.path.join(workdir, "label.npy"), "--steps", "5", "-o", trained])
    before = {t.name: t.raw_data for t in onnx.load(path).graph.initializer}
    after = {t.name: numpy_helper.to_array(t).tobytes() for t in onnx.load(trained).graph.initializer}
    frozen_same = all(after[n] == numpy_helper.to_array(t).tobytes()
                      for n, t in ((t.name, t) for t in onnx.load(path).graph.initializer) if n.startswith("0."))
    trained_moved = any(after[n] != numpy_helper.to_array(t).tobytes()
                        for n, t in ((t.name, t) for t in onnx.load(path).graph.initializer) if n.startswith("2."))
    if not before or not frozen_same or not trained_moved:
        fail(f"freeze: frozen unchanged {frozen_same}, others trained {trained_moved}")
    else:
        print("ok   freeze: frozen parameters bit-identical after 5 Adam steps, the others moved")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnxtrain", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as workdir:
        for loss in ["cross_entropy", "nll", "mse", "l1", "bce_with_logits"]:
            for opt in ["sgd", "momentum", "nesterov", "adagrad", "adam", "adamw"]:
                try:
                    check_loss_optimizer(args.onnxtrain, workdir, loss, opt)
                except Exception as e:
                    fail(f"{loss} x {opt}: {e}")
        for opset in (7, 9, 21):
            for opt in ["momentum", "adam"]:
                try:
                    check_loss_optimizer(args.onnxtrain, workdir, "cross_entropy", opt, opset)
                except Exception as e:
                    fail(f"cross_entropy x {opt} at opset {opset}: {e}")
        for name, (options, factory) in SCHEDULES.items():
            try:
                check_schedule(args.onnxtrain, workdir, name, options, factory)
            except Exception as e:
                fail(f"schedule {name}: {e}")
        try:
            check_freeze(args.onnxtrain, workdir)
        except Exception as e:
            fail(f"freeze: {e}")
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
