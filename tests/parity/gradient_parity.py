#!/usr/bin/env python3
"""Gradient parity with PyTorch: onnxtrain's Gradient operator against torch.autograd.

For each model (an MLP, a small CNN with BatchNorm in training mode, a transformer encoder
layer with GELU (exported as its Erf pattern), a scripted module with an `if` and a `for` in
either branch): export it with
torch.onnx.export, append a SoftmaxCrossEntropyLoss node and a Gradient node (xs = every
parameter, y = the loss) to the exported graph, run that model with
`onnxtrain run`, and compare each gradient with torch.autograd.grad of the same loss
(rtol 1e-4 and atol 1e-6, float32).

Usage: gradient_parity.py --onnxtrain build/release/src/onnxtrain
Runs with the project's .venv (PyTorch 2.13, onnx; scripts/setup-deps creates it).
"""
import argparse
import io
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import torch
from onnx import helper, TensorProto

RTOL, ATOL = 1e-4, 1e-6
OPSET = 17


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                                       torch.nn.Tanh(), torch.nn.Linear(16, 5))

    def forward(self, x):
        return self.net(x)


class Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.pool = torch.nn.MaxPool2d(2)
        self.fc = torch.nn.Linear(4 * 3 * 3, 5)

    def forward(self, x):
        y = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(y, 1))


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # activation="gelu" exports GELU as its Erf pattern (Div, Erf, Add, Mul, Mul) at opset 17.
        self.layer = torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0,
                                                      batch_first=True, activation="gelu")
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.head(self.layer(x).mean(dim=1))


class ControlFlow(torch.nn.Module):
    """Scripted: an `if` on a tensor condition becomes an If whose branches read the weights of a
    and b; TorchScript unrolls the 64-step `for` by 8 into a Loop with a constant trip count of 8,
    which the Gradient operator unrolls again."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 8)
        self.b = torch.nn.Linear(6, 8)
        self.c = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        if x.sum() > 0:
            h = torch.tanh(self.a(x))
        else:
            h = torch.relu(self.b(x)) * 0.5
        for _ in range(64):
            h = h + 0.02 * torch.tanh(self.c(h))
        return self.head(h)


def cases():
    g = torch.Generator().manual_seed(7)
    yield "mlp", Mlp(), torch.randn(6, 12, generator=g)
    yield "cnn", Cnn(), torch.randn(3, 2, 6, 6, generator=g)
    yield "transformer", Encoder(), torch.randn(2, 4, 8, generator=g)
    # A symbolic batch dim: ONNX shape inference then loses the ranks inside the attention
    # (Slice with computed starts, Reshape to computed shapes); the engine's own rank
    # propagation must recover them.
    yield "transformer_dynamic_batch", Encoder(), torch.randn(3, 4, 8, generator=g)
    # Both branches of the If: the sign of sum(x) picks one.
    x = torch.randn(4, 6, generator=g).abs()
    yield "control_flow_then", torch.jit.script(ControlFlow()), x
    yield "control_flow_else", torch.jit.script(ControlFlow()), -x


def sanitize(name):
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def check(name, model, x, onnxtrain, workdir):
    torch.manual_seed(0)
    for p in model.parameters():  # random non-trivial weights (BatchNorm's scale too)
        torch.nn.init.uniform_(p, -0.5, 0.5)
    model.train()
    labels = torch.arange(x.shape[0]) % 5

    # The reference: gradients of mean cross-entropy by autograd.
    params = dict(model.named_parameters())
    loss = torch.nn.functional.cross_entropy(model(x), labels)
    # A parameter the taken branch of an `if` does not read gets no gradient from autograd
    # (None) and zeros from the Gradient operator.
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    expected = {n: (torch.zeros_like(p) if g is None else g).detach().numpy()
                for (n, p), g in zip(params.items(), grads)}

    buffer = io.BytesIO()
    dynamic = {"x": {0: "N"}, "logits": {0: "N"}} if name.endswith("dynamic_batch") else None
    torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=OPSET, input_names=["x"], output_names=["logits"],
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, dynamic_axes=dynamic)
    m = onnx.load_from_string(buffer.getvalue())
    g = m.graph
    initializers = {i.name for i in g.initializer}
    xs = [n for n in params if n in initializers]
    if len(xs) != len(params):
        missing = sorted(set(params) - initializers)
        raise RuntimeError(f"{name}: parameters not found as initializers: {missing}")
    g.input.append(helper.make_tensor_value_info("labels", TensorProto.INT64, [x.shape[0]]))
    g.node.append(helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"], reduction="mean"))
    outputs = ["grad_" + n for n in xs]
    g.node.append(helper.make_node("Gradient", xs, outputs, domain="ai.onnx.preview.training", name="gradient",
                                   xs=xs, y="loss"))
    for o in outputs:
        g.output.append(helper.make_empty_tensor_value_info(o))
    m.opset_import.append(helper.make_opsetid("ai.onnx.preview.training", 1))
    path = os.path.join(workdir, name + ".onnx")
    onnx.save(m, path)
    np.save(os.path.join(workdir, "x.npy"), x.numpy())
    np.save(os.path.join(workdir, "labels.npy"), labels.numpy())
    out = os.path.join(workdir, name + "_out")
    run = subprocess.run([onnxtrain, "run", path, "--input", "x=" + os.path.join(workdir, "x.npy"),
                          "--input", "labels=" + os.path.join(workdir, "labels.npy"), "--output-dir", out],
                         capture_output=True, text=True)
    if run.returncode != 0:
        print(f"FAIL {name}: onnxtrain run exited {run.returncode}\n{run.stdout}{run.stderr}")
        return False
    ok = True
    for n in xs:
        got = np.load(os.path.join(out, sanitize("grad_" + n) + ".npy"))
        want = expected[n]
        if got.shape != want.shape or not np.allclose(got, want, rtol=RTOL, atol=ATOL):
            worst = np.max(np.abs(got - want)) if got.shape == want.shape else float("nan")
            print(f"FAIL {name}: gradient of {n} {want.shape}: max |diff| {worst:.3g}")
            ok = False
    print(("ok   " if ok else "FAIL ") + f"{name}: {len(xs)} parameter gradients against torch.autograd")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnxtrain", required=True, help="path of the onnxtrain executable")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ok = True
    with tempfile.TemporaryDirectory() as workdir:
        for name, model, x in cases():
            try:
                ok = check(name, model, x, args.onnxtrain, workdir) and ok
            except Exception as e:  # report and go on with the other models
                print(f"FAIL {name}: {e}")
                ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
