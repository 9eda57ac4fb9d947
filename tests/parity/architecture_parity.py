#!/usr/bin/env python3
"""Real architectures exported from PyTorch train as PyTorch trains them.

ResNet-18 and MobileNetV2 (tests/parity/vision_models.py, as torchvision builds them; num_classes 10, 32x32 inputs, BatchNormalization in
training mode), an nn.TransformerEncoder text classifier (nn.Embedding, padding mask) and a
2-layer nn.LSTM sequence classifier are
exported with torch.onnx.export (opset 17, TrainingMode.TRAINING, no constant folding, random
initial weights), made trainable with `onnxtrain make-trainable --loss cross_entropy`, and
trained on one batch of 8 with `onnxtrain step`, with SGD momentum and with AdamW. PyTorch
trains the same modules from the same weights on the same batch. The loss of every step and
every parameter after the last step must agree within rtol 1e-3 (atol 1e-5).
For the first optimizer of each float32 case, the same `onnxtrain step` with ONNXTRAIN_ARENA=0
(every kernel output on the heap) must give bit-identical losses and weights.
Dropout is exported with p = 0. BatchNorm running statistics: running_mean must equal
PyTorch's; running_var is compared with the ONNX definition (the batch's population variance)
rather than PyTorch's, which uses the unbiased variance.

What each case covers (CASES), and why some are shorter or in float64:
- The Transformer classifier: float32, 5 steps, both optimizers.
- resnet18 in float64, 5 steps, both optimizers: the gradients, optimizers and BatchNorm
  updates agree with PyTorch to about 1e-9. In float32 it runs 3 steps with SGD momentum:
  after 5 steps, or 3 with AdamW, float32 rounding (onnxtrain's kernels sum in other orders
  than PyTorch's) leaves some layer3/layer4 weights up to 2e-4 apart, while the float64 runs
  agree; the 32x32 input leaves layer4 1x1 feature maps, whose BatchNorm sees 8 values per
  channel.
- mobilenet_v2 in float64 for 2 steps and in float32 for 1: at 32x32 its training is chaotic.
  In PyTorch alone, float32 and float64 differ by 2.5 % in the loss after 3 steps, and storing
  BatchNorm's epsilon as float32 (as ONNX does: 1e-5 becomes 1e-5 - 2.5e-13) changes the
  float64 loss after 4 steps by 0.12 % and after 5 by 6 %; onnxtrain in float64 leaves
  weights 6e-4 apart from PyTorch's after 3 steps and agrees after 2.
- AdamW divides each gradient entry by its own magnitude, so an entry whose gradient is float
  noise (exactly zero in real arithmetic: the bias of a convolution or BatchNorm that feeds
  another BatchNorm, the key bias of attention) moves by +-lr per step in a direction the
  noise decides. Entries whose PyTorch gradient stays below 1e-3 of their tensor's largest, or
  below 1e-6 of the model's largest, at every step may differ by up to 2 lr per step.

- The 2-layer nn.LSTM sequence classifier (batch_first, the last step's output through a
  Linear layer): float32, 5 steps, both optimizers.

The same architectures are also exported with torch.onnx.export(dynamo=True) (opset 20, the
exporter's default; optimize=False, since the default graph optimization folds BatchNorm into
the convolutions and constant-folds and deduplicates weights, which changes what is trained).
The dynamo exporter writes BatchNormalization in inference mode whatever the module's mode
(onnxscript 0.7.2's torchlib sets training = False in aten__native_batch_norm_legit_functional
and drops the running-statistics updates), so resnet18 and mobilenet_v2 train with frozen
BatchNorm statistics there (calibrated by three forward passes before the export, see
calibrate_batch_norm), compared with PyTorch training the module with its BatchNorm layers in
eval mode; the test asserts that the export's BatchNorm is in inference mode and that
the statistics do not change. Dynamo cases (DYNAMO_CASES): the Transformer and LSTM
classifiers in float32 (5 steps, both optimizers), resnet18 in float64 (3 steps, SGD
momentum) and mobilenet_v2 in float32 (2 steps, SGD momentum; with frozen statistics its
float32 training is not chaotic), fewer than above to keep the test's runtime (about a
minute for these).

Usage: architecture_parity.py --onnxtrain build/release/src/onnxtrain [--only resnet18] [--exporters dynamo]
"""
import argparse
import contextlib
import io
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

import vision_models

RTOL, ATOL = 1e-3, 1e-5
STEPS = 5
failures = []


def fail(message):
    failures.append(message)
    print("FAIL " + message)


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(" ".join(cmd) + f" exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout


class TextClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(50, 32)  # padding_idx masks a gradient ONNX cannot express
        layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, tokens):
        h = self.encoder(self.embedding(tokens), src_key_padding_mask=tokens == 0)
        return self.fc(h.mean(dim=1))


class SequenceClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(16, 32, num_layers=2, batch_first=True)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.fc(y[:, -1])


def make(name, dtype):
    torch.manual_seed(5)
    g = torch.Generator().manual_seed(9)
    if name == "lstm":
        return SequenceClassifier().to(dtype), torch.randn(8, 12, 16, generator=g).to(dtype)
    if name == "transformer":
        tokens = torch.randint(1, 50, (8, 7), generator=g)
        tokens[:3, 5:] = 0  # padding
        return TextClassifier().to(dtype), tokens
    model = getattr(vision_models, name)(num_classes=10)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model.to(dtype), torch.randn(8, 3, 32, 32, generator=g).to(dtype)


# Learning rates small enough that 5 steps on one batch stay far from memorizing it: near a
# loss of 0 the last float bits of the gradients decide the trajectory.
OPTIMIZERS = {  # name: (make-trainable options, torch optimizer, lr)
    "momentum": (["--optimizer", "momentum", "--lr", "0.001"], lambda p: torch.optim.SGD(p, lr=0.001, momentum=0.9), 0.001),
    "adamw": (["--optimizer", "adamw", "--lr", "0.0001", "--weight-decay", "0.01"],
              lambda p: torch.optim.AdamW(p, lr=0.0001, weight_decay=0.01), 0.0001),
}
# (model, element type, steps): see the module doc for the float64 and 1-step cases.
CASES = [("transformer", torch.float32, 5, ["momentum", "adamw"]),
         ("lstm", torch.float32, 5, ["momentum", "adamw"]),
         ("resnet18", torch.float64, 5, ["momentum", "adamw"]),
         ("resnet18", torch.float32, 3, ["momentum"]),
         ("mobilenet_v2", torch.float64, 2, ["momentum", "adamw"]),
         ("mobilenet_v2", torch.float32, 1, ["momentum", "adamw"])]
# The same exported with torch.onnx.export(dynamo=True): see the module doc.
DYNAMO_CASES = [("transformer", torch.float32, 5, ["momentum", "adamw"]),
                ("lstm", torch.float32, 5, ["momentum", "adamw"]),
                ("resnet18", torch.float64, 3, ["momentum"]),
                ("mobilenet_v2", torch.float32, 2, ["momentum"])]


def calibrate_batch_norm(model, x):
    """Running statistics from three forward passes over the batch (no gradient): the dynamo
    export's inference-mode BatchNorm then normalizes as in training. With the initial mean 0
    and variance 1, mobilenet_v2's activations vanish (the loss is ln 10 to 15 digits) and
    many values sit exactly at ReLU6's 0, where PyTorch's hardtanh passes no gradient and an
    ONNX Clip, which may as well be a torch.clamp (gradient at the bounds), passes it."""
    with torch.no_grad():
        for _ in range(3):
            model(x)


def export(model, x, path, exporter):
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            torch.onnx.export(model, (x,), path, dynamo=True, optimize=False, input_names=["input"],
                              output_names=["logits"])
        else:
            torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17,
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                              input_names=["input"], output_names=["logits"])


def check(onnxtrain, workdir, name, dtype, steps, opt, check_arena=False, exporter="torchscript"):
    model, x = make(name, dtype)
    label = torch.arange(8) % 10
    path = os.path.join(workdir, f"{name}.onnx")
    model.train()
    if exporter == "dynamo":
        calibrate_batch_norm(model, x)
    export(model, x, path, exporter)
    exported = onnx.load(path)
    bn_modes = {next((a.i for a in n.attribute if a.name == "training_mode"), 0)
                for n in exported.graph.node if n.op_type == "BatchNormalization"}
    frozen_bn = exporter == "dynamo" and bool(bn_modes)
    if frozen_bn:
        if bn_modes != {0}:  # the exporter limitation of the module doc is gone
            raise RuntimeError(f"dynamo exported BatchNormalization with training_mode {bn_modes}: update the test")
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.eval()
    # Tracing ran the model in training mode, so the exported BatchNorm statistics are those
    # after one update: both sides start from the module's state after the export.
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for k, v in initial.items():
        if v.is_floating_point() and k in {t.name for t in exported.graph.initializer}:
            got = numpy_helper.to_array(next(t for t in exported.graph.initializer if t.name == k))
            if not np.array_equal(got, v.numpy()):
                raise RuntimeError(f"the export holds another value of {k} than the module")
    np.save(os.path.join(workdir, "input.npy"), x.numpy())
    np.save(os.path.join(workdir, "label.npy"), label.numpy())
    trainable = os.path.join(workdir, f"{name}_{opt}.onnx")
    trained = os.path.join(workdir, f"{name}_{opt}_trained.onnx")
    cli, make_optimizer, lr = OPTIMIZERS[opt]
    run([onnxtrain, "make-trainable", path, "-o", trainable, "--loss", "cross_entropy"] + cli)
    gradient = [n for n in onnx.load(trainable).training_info[0].algorithm.node if n.op_type == "Gradient"][0]
    trained_set = {x.decode() for a in gradient.attribute if a.name == "xs" for x in a.strings}
    if trained_set != {n for n, _ in model.named_parameters()}:
        raise RuntimeError(f"make-trainable trains {sorted(trained_set ^ {n for n, _ in model.named_parameters()})} "
                           "differently from PyTorch")
    # A fixed thread count: the two runs below are compared bit for bit, and without one each
    # follows the machine's load (under ctest -j2 one may run on 2 threads and the other on 1).
    step_cmd = [onnxtrain, "step", trainable, "--input", "input=" + os.path.join(workdir, "input.npy"),
                "--input", "label=" + os.path.join(workdir, "label.npy"), "--steps", str(steps),
                "--threads", str(len(os.sched_getaffinity(0))), "-o", trained]
    out = run(step_cmd)
    got_losses = [float(m.group(1)) for m in re.finditer(r"onnxtrain\.loss=(\S+)", out)]
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(trained).graph.initializer}
    if check_arena:
        # The memory plan must not change a bit: the same run with every output on the heap.
        heap = os.path.join(workdir, f"{name}_{opt}_heap.onnx")
        heap_out = run(step_cmd[:-1] + [heap], env=dict(os.environ, ONNXTRAIN_ARENA="0"))
        heap_weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(heap).graph.initializer}
        if heap_out.replace(heap, trained) != out or any(not np.array_equal(heap_weights[k], v) for k, v in weights.items()):
            fail(f"{name} x {opt}: ONNXTRAIN_ARENA=0 gives other results than the memory plan")

    optimizer = make_optimizer(model.parameters())
    want_losses, batch_vars = [], {}
    hooks = []
    for mod_name, m in model.named_modules():
        if isinstance(m, torch.nn.BatchNorm2d) and not frozen_bn:
            def record(module, inputs, _out, key=mod_name):
                batch_vars.setdefault(key, []).append(inputs[0].detach().var(dim=(0, 2, 3), unbiased=False))
            hooks.append(m.register_forward_hook(record))
    largest_grad = {}  # per parameter, the largest |gradient| of each entry over the steps
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), label)
        want_losses.append(loss.item())
        loss.backward()
        for pname, p in model.named_parameters():
            g = p.grad.detach().abs()
            largest_grad[pname] = torch.maximum(largest_grad[pname], g) if pname in largest_grad else g
        optimizer.step()
    for h in hooks:
        h.remove()
    what = f"{name} {exporter} {str(dtype).replace('torch.', '')} x {opt}"
    if len(got_losses) != steps or not np.allclose(got_losses, want_losses, rtol=RTOL, atol=ATOL):
        fail(f"{what}: losses differ\n  onnxtrain {got_losses}\n  torch     {want_losses}")
        return
    compared = 0
    global_largest = max(float(g.max()) for g in largest_grad.values())
    for pname, p in model.named_parameters():
        if pname not in weights:
            fail(f"{what}: parameter {pname} is not an initializer of the trained model")
            continue
        want = p.detach().numpy()
        atol = np.full(want.shape, ATOL)
        if opt == "adamw":  # gradient entries that are float noise: see the module doc
            g = largest_grad[pname].numpy()
            atol[(g <= 1e-3 * g.max()) | (g <= 1e-6 * global_largest)] = 2 * lr * steps
        if not np.all(np.abs(weights[pname] - want) <= atol + RTOL * np.abs(want)):
            fail(f"{what}: parameter {pname} differs by {np.max(np.abs(weights[pname] - want)):.3g}")
        compared += 1
    for mod_name, variances in batch_vars.items():
        mean_name, var_name = mod_name + ".running_mean", mod_name + ".running_var"
        want_mean = model.state_dict()[mean_name].numpy()
        if not np.allclose(weights[mean_name], want_mean, rtol=RTOL, atol=ATOL):
            fail(f"{what}: {mean_name} differs by {np.max(np.abs(weights[mean_name] - want_mean)):.3g}")
        # ONNX: running_var = momentum running_var + (1 - momentum) population variance.
        var = initial[var_name].clone()
        for v in variances:
            var = 0.9 * var + 0.1 * v
        if not np.allclose(weights[var_name], var.numpy(), rtol=RTOL, atol=ATOL):
            fail(f"{what}: {var_name} differs from the ONNX definition by {np.max(np.abs(weights[var_name] - var.numpy())):.3g}")
        compared += 2
    if frozen_bn:
        for k in (k for k in initial if k.endswith(".running_mean") or k.endswith(".running_var")):
            if not np.array_equal(weights[k], initial[k].numpy()):
                fail(f"{what}: the inference-mode BatchNorm statistic {k} changed")
            compared += 1
    print(f"done {what}: {steps} losses {got_losses[0]:.4f} .. {got_losses[-1]:.4f}, {compared} tensors compared")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--onnxtrain", required=True)
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--exporters", default="torchscript,dynamo", help="torchscript (dynamo=False), dynamo")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else [c[0] for c in CASES]
    exporters = args.exporters.split(",")
    with tempfile.TemporaryDirectory() as workdir:
        for exporter, cases in (("torchscript", CASES), ("dynamo", DYNAMO_CASES)):
            if exporter not in exporters:
                continue
            for name, dtype, steps, optimizers in cases:
                if name not in names:
                    continue
                for opt in optimizers:
                    try:
                        check(args.onnxtrain, workdir, name, dtype, steps, opt,
                              check_arena=dtype == torch.float32 and opt == optimizers[0] and exporter == "torchscript",
                              exporter=exporter)
                    except Exception as e:  # an exporter or onnxtrain failure: reported, counted
                        fail(f"{name} {exporter} x {opt}: {type(e).__name__}: {e}")
    print(f"architecture parity: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
